"""Tile statistics and tile-level region merging (imgdiff.regions), golden values."""

import numpy as np
import pytest

import imgdiff
from imgdiff.regions import TILE, empty_stats, regions_from_tiles, tile_stats_from_mask


def test_tile_stats_from_unaligned_crop():
    mask = np.zeros((10, 40), bool)
    delta = np.zeros((10, 40), np.int64)
    mask[2, 3], delta[2, 3] = True, 7  # image (y=22, x=13): tile (1, 0)
    mask[9, 30], delta[9, 30] = True, 9  # image (29, 40): tile (1, 2)
    mask[9, 31], delta[9, 31] = True, 5
    st = tile_stats_from_mask(mask, delta, (20, 10), 64, 64)
    assert st.count.tolist()[1] == [1, 0, 2, 0]
    assert st.total[1, 2] == 14 and st.peak[1, 2] == 9
    assert st.box[1, 0].tolist() == [13, 22, 13, 22] and st.box[1, 2].tolist() == [40, 29, 41, 29]


def _stats_with(pixels, h=64, w=160):
    st = empty_stats(h, w)
    for y, x, d in pixels:
        t = (y // TILE, x // TILE)
        st.count[t] += 1
        st.total[t] += d
        st.peak[t] = max(st.peak[t], d)
        st.box[t] = [min(st.box[t][0], x), min(st.box[t][1], y), max(st.box[t][2], x), max(st.box[t][3], y)]
    return st


@pytest.mark.parametrize(
    ("gap", "expect"),
    [
        (0, [(5, 5, 20, 5), (52, 5, 52, 5), (100, 5, 100, 5)]),  # tiles 0 and 1 touch: always one region
        (15, [(5, 5, 20, 5), (52, 5, 52, 5), (100, 5, 100, 5)]),  # one empty tile (2) needs gap >= 16
        (16, [(5, 5, 52, 5), (100, 5, 100, 5)]),  # tiles 4, 5 empty between x=52 and x=100
        (31, [(5, 5, 52, 5), (100, 5, 100, 5)]),
        (32, [(5, 5, 100, 5)]),
    ],
)
def test_merge_gap_in_tiles(gap, expect):
    st = _stats_with([(5, 5, 10), (5, 20, 30), (5, 52, 20), (5, 100, 1)])
    assert [r.bbox for r in regions_from_tiles(st, merge_gap=gap, scale=1)] == expect


def test_region_stats_and_16bit_scale():
    st = _stats_with([(1, 1, 257 * 4), (2, 3, 257 * 2)])
    (r,) = regions_from_tiles(st, merge_gap=0, scale=257)
    assert r.bbox == (1, 1, 3, 2) and r.pixels == 2 and r.max_delta == 4.0 and r.mean_delta == 3.0


def test_diff_regions_are_exact_boxes_per_group():
    a = np.zeros((64, 128, 3), np.uint8)
    b = a.copy()
    b[3, 4], b[17, 18] = 10, 20  # tiles (0,0) and (1,1): one region, exact pixel box
    b[40, 100:103] = 5
    res = imgdiff.diff(a, b, mode="exact", merge_gap=0, backend="numpy")
    assert [r.bbox for r in res.regions] == [(4, 3, 18, 17), (100, 40, 102, 40)]
    assert [r.pixels for r in res.regions] == [2, 3] and res.regions[0].mean_delta == 15.0
    assert res.bbox == (4, 3, 102, 40)


def test_negative_merge_gap():
    with pytest.raises(ValueError, match="merge_gap must be >= 0"):
        imgdiff.diff(np.zeros((4, 4), np.uint8), np.ones((4, 4), np.uint8), merge_gap=-1)
