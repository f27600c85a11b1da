"""Exact-mode tile statistics: the NumPy chunked path and the Numba tile-row kernel vs brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgdiff import diff
from imgdiff.exact_tiles import exact_stats_numpy
from imgdiff.regions import tile_stats_from_mask


def brute(a, b, thr, boxes):
    """Reference: the full mask of channel-max deltas > thr, minus ignored pixels, reduced per tile."""
    d = np.abs(a.astype(np.int64) - b.astype(np.int64)).max(axis=2)  # (H, W)
    m = d > thr
    for x0, y0, x1, y1 in boxes:
        m[y0 : y1 + 1, x0 : x1 + 1] = False
    return tile_stats_from_mask(m, d, (0, 0), *d.shape)


def make_pair(seed, h, w, c, dtype, density):
    rng = np.random.default_rng(seed)
    top = np.iinfo(dtype).max
    a = rng.integers(0, top + 1, (h, w, c), dtype=np.int64).astype(dtype)
    b = a.copy()
    hit = rng.random((h, w)) < density  # (H, W) pixels that change
    noise = rng.integers(-40 * (top // 255), 40 * (top // 255) + 1, (h, w, c))
    b[hit] = np.clip(a[hit].astype(np.int64) + noise[hit], 0, top).astype(dtype)
    return a, b


def assert_same(got, want):
    on = want.count > 0
    np.testing.assert_array_equal(got.count, want.count)
    np.testing.assert_array_equal(got.total, want.total)
    np.testing.assert_array_equal(got.peak, want.peak)
    np.testing.assert_array_equal(got.box[on], want.box[on])


pairs = st.tuples(
    st.integers(0, 2**31),  # seed
    st.integers(1, 150),  # h: > CHUNK tile rows, partial last tile row
    st.integers(1, 70),  # w: partial last tile column
    st.sampled_from([1, 3, 4]),
    st.sampled_from([np.uint8, np.uint16]),
    st.sampled_from([0.0005, 0.05, 1.0]),
    st.integers(0, 60),  # thr, in 0-255 units
    st.lists(  # ignore boxes (x, y, dx, dy)
        st.tuples(st.integers(0, 80), st.integers(0, 160), st.integers(0, 40), st.integers(0, 60)), max_size=3
    ),
)


def unpack(args):
    seed, h, w, c, dtype, density, thr, raw_boxes = args
    a, b = make_pair(seed, h, w, c, dtype, density)
    thr = thr * (257 if dtype == np.uint16 else 1)
    boxes = [(x, y, min(x + dx, w - 1), min(y + dy, h - 1)) for x, y, dx, dy in raw_boxes if x < w and y < h]
    return a, b, thr, boxes


@settings(max_examples=60, deadline=None)
@given(pairs)
def test_numpy_exact_stats_match_brute_force(args):
    a, b, thr, boxes = unpack(args)
    got = exact_stats_numpy(a, b, thr=thr, boxes=np.array(boxes, np.int64).reshape(-1, 4))
    assert_same(got, brute(a, b, thr, boxes))


@settings(max_examples=60, deadline=None)
@given(pairs)
def test_numba_exact_stats_match_brute_force(args):
    from imgdiff.kernels_cpu import exact_stats_numba

    a, b, thr, boxes = unpack(args)
    got = exact_stats_numba(a, b, thr=thr, boxes=np.array(boxes, np.int64).reshape(-1, 4))
    assert_same(got, brute(a, b, thr, boxes))


def test_thresholds_at_and_above_the_dtype_max_find_nothing():
    a = np.zeros((20, 20, 3), np.uint8)
    b = a.copy()
    b[3, 4] = 255
    for backend in ("numpy", "numba"):
        assert diff(a, b, mode="exact", threshold=254, backend=backend).bbox == (4, 3, 4, 3)
        assert diff(a, b, mode="exact", threshold=255, backend=backend).bbox is None
        assert diff(a, b, mode="exact", threshold=1e6, backend=backend).bbox is None


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_all_pixels_differ_full_boxes_and_counts(backend):
    """Every pixel changed: every tile has the full (clipped) box; a 2K-wide pair keeps it quick."""
    h, w = 40, 2050
    a = np.zeros((h, w, 3), np.uint8)
    b = np.full((h, w, 3), 7, np.uint8)
    b[:, :, 1] = 9
    r = diff(a, b, mode="exact", backend=backend, merge_gap=0)
    assert r.bbox == (0, 0, w - 1, h - 1)
    assert r.changed_pixels == h * w
    assert [(g.max_delta, g.mean_delta) for g in r.regions] == [(9.0, 9.0)]
