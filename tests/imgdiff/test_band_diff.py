"""diff_band on the rows band_rows picks gives exactly diff's answer on the whole images."""

import numpy as np
import pytest

from imgdiff import diff
from imgdiff.band_diff import band_rows, diff_band, window_columns
from tests.imgdiff.cases import CASE_NAMES, jpeg, make_case, photo
from tests.imgdiff.realcases import make_case as real_case


def _changed_span(a: np.ndarray, b: np.ndarray):
    rows = np.flatnonzero((a != b).reshape(a.shape[0], -1).any(axis=1))
    return (int(rows[0]), int(rows[-1])) if rows.size else (0, 0)


def _check(a, b, mode, **kw):
    r0, r1 = _changed_span(a, b)
    y0, y1 = band_rows(a.shape[0], r0, r1, mode=mode)
    assert y0 <= r0 and r1 < y1
    got = diff_band(a[y0:y1], b[y0:y1], y0=y0, height=a.shape[0], mode=mode, **kw)
    assert got == diff(a, b, mode=mode, **kw)
    return got, (y0, y1)


def _with_patches(a, rng, *, count, rows, cols, size):
    """A copy of ``a`` with ``count`` patches (top-left row in ``rows``, column in ``cols``, up to ``size``
    = (h, w)) brightened by 1, 3, 9 or 60 levels, clipped; draws from ``rng`` in a fixed order."""
    b = a.copy()
    for _ in range(count):
        y, x = int(rng.integers(*rows)), int(rng.integers(*cols))
        hh, ww = int(rng.integers(1, size[0])), int(rng.integers(1, size[1]))
        delta = int(rng.choice([1, 3, 9, 60]))
        b[y : y + hh, x : x + ww] = np.clip(b[y : y + hh, x : x + ww].astype(int) + delta, 0, 255)
    return b


@pytest.mark.parametrize("mode", ["exact", "robust"])
@pytest.mark.parametrize("seed", range(4))
def test_random_patches_tall_image(mode, seed):
    """Patches (strong, weak bumps, single pixels) at random rows of a 700-row photo."""
    rng = np.random.default_rng(seed)
    a = photo(700, 96, seed=seed)
    b = _with_patches(a, rng, count=int(rng.integers(1, 4)), rows=(0, 690), cols=(0, 86), size=(40, 10))
    got, (y0, y1) = _check(a, b, mode)
    assert not got.same
    _check(a, b, mode, ignore=[(0, y0 + 3, 20, y1 + 50)])


@pytest.mark.parametrize("mode", ["exact", pytest.param("robust", marks=pytest.mark.slow)])
def test_band_is_a_strict_part_of_a_tall_image(mode):
    a = photo(900, 64, seed=7)
    b = a.copy()
    b[450:452, 30] = 255 - b[450:452, 30]
    got, (y0, y1) = _check(a, b, mode)
    assert got.bbox == (30, 450, 30, 451) and 0 < y0 and y1 < 900


def test_golden_cases_and_jpeg_noise():
    for name in CASE_NAMES:
        case = make_case(name, h=200, w=160)
        if case.a.shape == case.b.shape:
            _check(case.a, case.b, "robust")
    a = photo(300, 64, seed=1)
    _check(a, jpeg(a), "robust")


@pytest.mark.parametrize("mode", ["exact", "robust"])
@pytest.mark.parametrize("seed", range(4))
def test_random_patches_wide_image_window(mode, seed):
    """A wide band: diff_band diffs only a window of columns, and must still give diff's answer,
    ignore boxes across the window's edges included."""
    rng = np.random.default_rng(seed)
    a = photo(400, 900, seed=seed)
    b = _with_patches(a, rng, count=int(rng.integers(1, 3)), rows=(150, 250), cols=(0, 890), size=(20, 30))
    got, (y0, y1) = _check(a, b, mode)
    x0, x1 = window_columns(a[y0:y1], b[y0:y1], mode=mode)
    cols = np.flatnonzero((a != b).any(axis=(0, 2)))
    assert x0 <= cols[0] and cols[-1] < x1
    _check(a, b, mode, ignore=[(x0 - 5, 0, x0 + 30, 399), (x1 - 3, y0 + 3, 899, y1 + 50)])


def test_window_is_a_strict_part_of_a_wide_band():
    a = photo(300, 1200, seed=3)
    b = a.copy()
    b[140:150, 600:610] = 255 - b[140:150, 600:610]
    got, (y0, y1) = _check(a, b, "robust")
    assert got.bbox == (600, 140, 609, 149) and got.width == 1200
    assert window_columns(a[y0:y1], b[y0:y1]) == (512 - 128, 640 + 128)
    assert window_columns(a[y0:y1], b[y0:y1], spread=200) == band_rows(1200, 600, 609, spread=200)
    gray = np.ascontiguousarray(a[:, :, 0])  # (H, W) arrays: the window works on them too
    _check(gray, np.ascontiguousarray(b[:, :, 0]), "robust")


def test_texture_just_left_of_a_cell_is_in_the_window():
    """test_texture_just_above_a_cell_is_in_the_band, turned by 90 degrees: the window's columns need
    the same context as the band's rows."""
    rng = np.random.default_rng(0)
    a = np.full((64, 512, 3), 100, np.uint8)
    a[:, 120:128] = rng.integers(0, 256, (64, 8, 3), dtype=np.uint8)
    b = a.copy()
    b[:, 128:136] += 3
    assert diff(a, b).same  # the texture explains the bump away
    assert diff_band(a, b, y0=0, height=64).same
    x0, _ = window_columns(a, b)
    assert x0 < 120


def test_band_rows_aligned_and_clipped():
    assert band_rows(2160, 1080, 1112, mode="exact") == (1072, 1120)
    assert band_rows(2160, 1080, 1112, mode="robust") == (896, 1280)
    assert band_rows(100, 0, 99, mode="robust") == (0, 100)
    assert band_rows(2160, 1080, 1112, mode="robust", spread=200) == (768, 1408)


def test_diff_band_needs_equal_shapes():
    with pytest.raises(ValueError, match="one shape"):
        diff_band(np.zeros((4, 4), np.uint8), np.zeros((4, 5), np.uint8), y0=0, height=4)


def test_texture_just_above_a_cell_is_in_the_band():
    """A weak bump in the first rows of a 128-px pyramid cell, under a textured strip that lies in
    the cell above: the strip raises the bump's noise allowance, so the band must include it."""
    rng = np.random.default_rng(0)
    a = np.full((512, 64, 3), 100, np.uint8)
    a[120:128] = rng.integers(0, 256, (8, 64, 3), dtype=np.uint8)
    b = a.copy()
    b[128:136] += 3
    full = diff(a, b)
    assert full.same  # the texture explains the bump away
    got, (y0, _) = _check(a, b, "robust")
    assert y0 < 120
    flat = a.copy()
    flat[120:128] = 100
    assert not diff(flat, b - a + flat).same  # without the texture the bump is found


@pytest.mark.slow
@pytest.mark.parametrize("levels", [1, 2])
@pytest.mark.parametrize(
    "case_name", ["text_shift_right", "text_sub_0.5_0", "patch_16x16_24_grey_jpeg", "patch_64x64_40_colour"]
)
def test_band_equals_whole_on_real_photos_with_few_levels(case_name, levels):
    """With a shallow pyramid the context of the pyramid is small: the band must still hold what the
    coherent-displacement step reads around changed tiles."""
    case = real_case("astronaut", case_name)
    a, b = case.a, case.b
    r0, r1 = _changed_span(a, b)
    y0, y1 = band_rows(a.shape[0], r0, r1, mode="robust", levels=levels)
    got = diff_band(a[y0:y1], b[y0:y1], y0=y0, height=a.shape[0], mode="robust", levels=levels)
    assert got == diff(a, b, mode="robust", levels=levels)
