"""Golden robust-mode cases (imgdiff.cases) with per-case box tolerances, plus exact-mode boxes."""

import numpy as np
import pytest

import imgdiff
from tests.imgdiff.cases import CASE_NAMES, make_case


@pytest.fixture(scope="module")
def cases():
    return {n: make_case(n) for n in CASE_NAMES}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_robust_golden(cases, name):
    c = cases[name]
    res = imgdiff.diff(c.a, c.b)
    if c.expect is None:
        assert res.bbox is None, f"{name}: expected no difference, got {res.bbox}"
        return
    assert res.bbox is not None, f"{name}: expected {c.expect}, got no difference"
    for got, exp, tol in zip(res.bbox, c.expect, c.tol):
        assert abs(got - exp) <= tol, f"{name}: got {res.bbox}, expected {c.expect} +- {c.tol}"


def test_exact_golden_boxes(cases):
    # Exact mode sees every changed pixel: the box of the raw delta, JPEG noise included.
    for name in ("small_patch", "single_pixel", "thin_line", "removed_dot", "alpha_change"):
        c = cases[name]
        assert imgdiff.diff(c.a, c.b, mode="exact").bbox == c.expect, name
    assert imgdiff.diff(cases["jpeg_q90"].a, cases["jpeg_q90"].b, mode="exact").bbox is not None


def test_isolated_strong_change_is_never_dropped_next_to_text(cases):
    c = cases["text_subpixel_shift"]
    b = c.b.copy()
    ys, xs = np.nonzero(np.abs(c.b.astype(int) - c.a.astype(int)).max(axis=2) > 5)
    y, x = int(ys[0]) + 6, int(xs[0])  # a flat pixel just below the text
    b[y, x] = (b[y, x].astype(int) + 90).clip(0, 255)
    res = imgdiff.diff(c.a, b)
    assert res.bbox == (x, y, x, y)


def _noise_pair(box):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)  # high-texture reference: 3x3 range ~0..255
    b = a.copy()
    y0, y1, x0, x1 = box
    b[y0:y1, x0:x1] ^= 0x80  # every channel changes by exactly 128
    return a, b


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_coherent_strong_block_on_texture_is_kept_whole(backend):
    a, b = _noise_pair((5, 10, 10, 18))
    res = imgdiff.diff(a, b, backend=backend)
    assert res.bbox == (10, 5, 17, 9) == imgdiff.diff(a, b, mode="exact").bbox
    assert res.changed_pixels == 40
    assert [(r.bbox, r.pixels, r.max_delta, r.mean_delta) for r in res.regions] == [
        ((10, 5, 17, 9), 40, 128.0, 128.0)
    ]
    mask = imgdiff.change_mask(a, b, backend=backend)
    assert mask.sum() == 40 and mask[5:10, 10:18].all()


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_coherent_strong_block_at_the_image_corner(backend):
    # Windows are clipped to the image: a 3x3 block in the corner is a full (clipped) window.
    a, b = _noise_pair((0, 3, 45, 48))
    assert imgdiff.diff(a, b, backend=backend).bbox == (45, 0, 47, 2)


def test_robust_params_validation():
    a = np.zeros((8, 8), np.uint8)
    with pytest.raises(ValueError, match="window must be odd"):
        imgdiff.diff(a, a, window=4)
    with pytest.raises(TypeError, match="unknown robust parameter"):
        imgdiff.diff(a, a, margins=3)


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.uint16, np.int32, np.uint64])
@pytest.mark.parametrize("s", [1, 8, 16])
def test_block_sum_is_exact_for_every_accumulator(dtype, s):
    from imgdiff.robust import _block_sum

    rng = np.random.default_rng(s)
    hi = {np.bool_: 2, np.uint8: 256, np.uint16: 65536, np.int32: 2**20, np.uint64: 2**40}[dtype]
    x = rng.integers(-hi if dtype == np.int32 else 0, hi, (37, 45, 3)).astype(dtype)
    x[0, 0] = hi - 1  # the dtype's extreme values in one block
    ref = np.zeros((-(-37 // s), -(-45 // s), 3), np.int64)
    for y in range(37):
        for xx in range(45):
            ref[y // s, xx // s] += x[y, xx].astype(np.int64)
    got = _block_sum(x, s)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref)
