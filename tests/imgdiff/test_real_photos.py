"""Robust mode on real photos (tests.imgdiff.realcases): codec noise is "same", planted changes and
one-pixel layout shifts are found with their boxes, sub-pixel re-renders are "same".

The thresholds of :class:`imgdiff.robust.RobustParams` were tuned with all five photos in view, so
these are regression tests, not a held-out check (see docs/imgdiff.md, "Robust mode").
"""

import numpy as np
import pytest

import imgdiff
from tests.imgdiff.realcases import (
    CASE_NAMES,
    JPEG_NAMES,
    PHOTOS,
    TEXT_SHIFT_NAMES,
    TEXT_SUB_NAMES,
    iou,
    make_case,
)

MIN_IOU = {"patch": 0.9, "text_shift": 0.8}

SLOW_4K = (
    JPEG_NAMES
    + ("text_sub_0.5_0", "text_sub_0.25_0.25")
    + TEXT_SHIFT_NAMES
    + (
        "patch_16x16_24_grey_jpeg",
        "patch_16x16_40_colour_jpeg",
        "patch_64x64_24_colour",
        "patch_200x120_80_grey_jpeg",
    )
)


def _check(c) -> None:
    res = imgdiff.diff(c.a, c.b, backend="numpy")
    where = f"{c.photo}/{c.name}/{c.size}"
    if c.expect is None:
        assert res.bbox is None, f"{where}: expected no difference, got {res.bbox} ({res.changed_pixels} px)"
        return
    bound = MIN_IOU["text_shift" if c.name.startswith("text_shift") else "patch"]
    got = iou(res.bbox, c.expect)
    assert got >= bound, f"{where}: IoU {got:.3f} < {bound}: got {res.bbox}, expected {c.expect}"


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("photo", PHOTOS)
def test_real_photo_small(photo, name):
    _check(make_case(photo, name, "small"))


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_4K)
@pytest.mark.parametrize("photo", PHOTOS)
def test_real_photo_4k(photo, name):
    _check(make_case(photo, name, "4k"))


def test_corpus_is_seeded_and_pure():
    one, two = (
        make_case("coffee", "patch_32x32_40_colour_jpeg"),
        make_case("coffee", "patch_32x32_40_colour_jpeg"),
    )
    assert one.expect == two.expect and np.array_equal(one.b, two.b)
    base = make_case("coffee", "jpeg_q90").a
    assert not base.flags.writeable  # the cached photo is never written into
    for name in TEXT_SUB_NAMES + TEXT_SHIFT_NAMES:
        c = make_case("chelsea", name)
        assert c.a.shape == c.b.shape == (540, 960, 3) and not np.array_equal(c.a, c.b), name


def test_text_shift_box_is_the_union_of_both_renderings():
    c = make_case("rocket", "text_shift_both")
    d = np.abs(c.b.astype(int) - c.a.astype(int)).max(axis=2) > 0
    ys, xs = np.nonzero(d)
    x0, y0, x1, y1 = c.expect
    assert x0 <= xs.min() and xs.max() <= x1 and y0 <= ys.min() and ys.max() <= y1
    assert (xs.max() - xs.min()) >= 0.95 * (x1 - x0)  # the changed pixels span the union box


@pytest.mark.parametrize(
    "photo,name",
    [("grace_hopper", "text_shift_down"), ("chelsea", "patch_64x64_40_grey_jpeg"), ("coffee", "jpeg_q75")],
)
def test_numba_matches_numpy_on_real_photos(photo, name):
    c = make_case(photo, name)
    ref = imgdiff.diff(c.a, c.b, backend="numpy")
    assert imgdiff.diff(c.a, c.b, backend="numba") == ref
    assert np.array_equal(imgdiff.change_mask(c.a, c.b, backend="numba"), imgdiff.change_mask(c.a, c.b))


def test_unknown_case_and_photo_are_clear_errors():
    with pytest.raises(KeyError, match="unknown case"):
        make_case("coffee", "patch_8x8_24_grey")
    with pytest.raises(KeyError, match="unknown photo"):
        make_case("lena", "jpeg_q90")
