"""Exact mode against a brute-force NumPy reference, input normalisation, and bad inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import imgdiff
from imgdiff import core


def brute_mask(a, b, threshold, ignore=()):
    """Plain reference: per-channel |a-b| > threshold anywhere, ignored boxes removed."""
    d = np.abs(a.astype(np.int64) - b.astype(np.int64))
    m = (d > threshold).any(axis=2) if d.ndim == 3 else d > threshold
    for x0, y0, x1, y1 in ignore:
        m[max(y0, 0) : max(y1 + 1, 0), max(x0, 0) : max(x1 + 1, 0)] = False  # no negative wrap-around
    return m


def brute_bbox(m):
    if not m.any():
        return None
    ys, xs = np.nonzero(m)
    return (int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max()))


@st.composite
def pairs(draw):
    h = draw(st.integers(1, 70))
    w = draw(st.integers(1, 70))
    c = draw(st.sampled_from([1, 3, 4]))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
    b = a.copy()
    for _ in range(draw(st.integers(0, 6))):
        y, x, ch = rng.integers(0, h), rng.integers(0, w), rng.integers(0, c)
        b[y, x, ch] = rng.integers(0, 256)
    boxes = []
    for _ in range(draw(st.integers(0, 2))):
        xs = sorted(rng.integers(-3, w + 3, 2))
        ys = sorted(rng.integers(-3, h + 3, 2))
        boxes.append((int(xs[0]), int(ys[0]), int(xs[1]), int(ys[1])))
    thr = draw(st.sampled_from([0, 0.5, 3, 40, 200]))
    return a, b, boxes, thr


@settings(max_examples=150, deadline=None)
@given(pairs())
def test_exact_matches_brute_force(case):
    a, b, boxes, thr = case
    ref = brute_mask(a, b, thr, boxes)
    res = imgdiff.diff(a, b, mode="exact", threshold=thr, ignore=boxes, backend="numpy", merge_gap=2)
    assert res.bbox == brute_bbox(ref)
    assert res.changed_pixels == int(ref.sum())
    np.testing.assert_array_equal(imgdiff.change_mask(a, b, mode="exact", threshold=thr, ignore=boxes), ref)


@settings(max_examples=80, deadline=None)
@given(pairs())
def test_exact_bbox_shape_trick_matches(case):
    a, b, _, thr = case
    a3, b3, scale = core.normalise_pair(a, b)
    thr_raw = core.raw_threshold(thr, scale)
    grid = core.block_max_numpy(a3, b3)
    assert core.exact_bbox(a3, b3, thr_raw, grid) == brute_bbox(brute_mask(a, b, thr))


def test_single_pixel_in_4k():
    a = np.zeros((2160, 3840, 3), np.uint8)
    b = a.copy()
    b[1234, 3001, 2] = 1
    res = imgdiff.diff(a, b, mode="exact")
    assert res.bbox == (3001, 1234, 3001, 1234)
    assert res.changed_pixels == 1 and res.regions[0].max_delta == 1.0
    assert imgdiff.diff(a, b, mode="robust").bbox is None  # 1 level, alone: below the strong margin
    b[1234, 3001, 2] = 90
    assert imgdiff.diff(a, b).bbox == (3001, 1234, 3001, 1234)


def test_gray_vs_rgb_same_content_and_alpha():
    rng = np.random.default_rng(0)
    g = rng.integers(0, 256, (20, 30), dtype=np.uint8)
    rgb = np.repeat(g[:, :, None], 3, axis=2)
    assert imgdiff.diff(g, rgb, mode="exact").same
    rgba = np.concatenate([rgb, np.full((20, 30, 1), 255, np.uint8)], axis=2)
    assert imgdiff.diff(rgb, rgba, mode="exact").same  # missing alpha = opaque
    rgba[3, 4, 3] = 100
    assert imgdiff.diff(rgb, rgba, mode="exact").bbox == (4, 3, 4, 3)


def test_uint16_vs_uint8_common_scale():
    a8 = np.full((8, 8, 3), 200, np.uint8)
    a16 = a8.astype(np.uint16) * 257
    assert imgdiff.diff(a8, a16, mode="exact").same
    a16[2, 5, 0] += 257 * 3
    res = imgdiff.diff(a8, a16, mode="exact", threshold=2.5)
    assert res.bbox == (5, 2, 5, 2) and res.regions[0].max_delta == pytest.approx(3.0)
    assert imgdiff.diff(a8, a16, mode="exact", threshold=3).same


def test_size_mismatch():
    a = np.zeros((10, 12, 3), np.uint8)
    b = np.zeros((8, 12, 3), np.uint8)
    with pytest.raises(imgdiff.SizeMismatchError, match=r"A is 12x10, B is 12x8; pass allow_size_mismatch"):
        imgdiff.diff(a, b)
    res = imgdiff.diff(a, b, allow_size_mismatch=True, mode="exact")
    assert res.bbox == (0, 8, 11, 9) and res.changed_pixels == 24 and (res.width, res.height) == (12, 10)
    assert imgdiff.change_mask(a, b, allow_size_mismatch=True).shape == (10, 12)


@pytest.mark.parametrize(
    ("arr", "msg"),
    [
        (np.zeros((4, 4), np.float32), "dtype uint8 or uint16"),
        (np.zeros((4, 4, 2), np.uint8), "1, 3 or 4 channels"),
        (np.zeros((4,), np.uint8), r"shape \(H, W\)"),
        (np.zeros((0, 4), np.uint8), "non-empty"),
        ([[1, 2]], "numpy array"),
    ],
)
def test_bad_arrays(arr, msg):
    with pytest.raises(ValueError, match=msg):
        imgdiff.diff(np.zeros((4, 4), np.uint8), arr)


def test_bad_options():
    a = np.zeros((4, 4), np.uint8)
    with pytest.raises(ValueError, match="unknown mode"):
        imgdiff.diff(a, a, mode="fuzzy")
    with pytest.raises(ValueError, match="unknown backend"):
        imgdiff.diff(a, a, backend="opencl")
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        imgdiff.diff(a, a, mode="exact", threshold=-1)
    with pytest.raises(ValueError, match="x0 <= x1"):
        imgdiff.diff(a, a, ignore=[(3, 0, 1, 2)])
    with pytest.raises(ValueError, match="no extra parameters"):
        imgdiff.diff(a, a, mode="exact", margin=3)
    with pytest.raises(TypeError, match="zz"):
        imgdiff.diff(a, a, zz=3)


def test_import_does_not_load_numba_or_torch():
    import subprocess
    import sys

    code = "import sys, imgdiff; print('numba' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("mode", ["exact", "robust"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_diff_and_mask_equals_diff_and_change_mask(mode, backend):
    from tests.imgdiff.cases import make_case

    c = make_case("jpeg_q90_patch", h=96, w=128)
    kw = dict(mode=mode, backend=backend, ignore=[(0, 0, 9, 9)])
    result, mask = imgdiff.diff_and_mask(c.a, c.b, **kw)
    assert result == imgdiff.diff(c.a, c.b, **kw)
    np.testing.assert_array_equal(mask, imgdiff.change_mask(c.a, c.b, **kw))
    assert mask.sum() == result.changed_pixels


def test_package_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, imgdiff; print('numpy' in sys.modules, 'cv2' in sys.modules); imgdiff.diff"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 50), st.integers(1, 50), st.sampled_from([1, 3, 4]),
    st.sampled_from([np.uint8, np.uint16]), st.sampled_from([1, 3, 4, 5, 16]), st.integers(0, 2**31),
)  # fmt: skip
def test_block_max_numpy_matches_brute_force(h, w, c, dtype, block, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, np.iinfo(dtype).max + 1, (h, w, c)).astype(dtype)
    b = a.copy()
    b[rng.random((h, w, c)) < 0.05] = 7
    d = np.abs(a.astype(np.int64) - b.astype(np.int64)).max(axis=2)  # (h, w)
    ref = np.zeros((-(-h // block), -(-w // block)), np.int64)
    for y in range(h):
        for x in range(w):
            ref[y // block, x // block] = max(ref[y // block, x // block], d[y, x])
    got = core.block_max_numpy(a, b, block)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("h", [37, 64, 100])
def test_row_halves_in_two_threads_equal_one_pass(monkeypatch, h):
    """Large images take their block passes in two row halves (threads); the result is the same."""
    from imgdiff import robust

    rng = np.random.default_rng(h)
    a = rng.integers(0, 256, (h, 52, 3), dtype=np.uint8)
    b = a.copy()
    b[rng.random((h, 52)) < 0.05] += 9  # scattered changes in both halves
    b[h // 2 - 3 : h // 2 + 3, 10:30] = 255  # and a change across the split
    one = [core.block_max_numpy(a, b, 16), robust._block_sum_diff(b, a, 4), imgdiff.diff(a, b)]
    monkeypatch.setattr(core, "PARALLEL_ELEMENTS", 1)
    split = [core.block_max_numpy(a, b, 16), core.in_row_halves(robust._block_sum_diff, b, a, 4, unit=4)]
    np.testing.assert_array_equal(split[0], one[0])
    np.testing.assert_array_equal(split[1], one[1])
    assert imgdiff.diff(a, b) == one[2]

    def boom(x, y):
        raise ValueError(f"rows {x.shape[0]}")

    with pytest.raises(ValueError, match="rows"):  # an error in either half reaches the caller
        core.in_row_halves(boom, a, b, unit=4)


def test_changed_bands_equals_changed_rows_per_band():
    # First rows' prefixes compared first, then runs of bands in full: same as reducing changed_rows per
    # band, with changes on first rows, past the prefix, on other rows only, ragged last bands and odd
    # row byte lengths.
    rng = np.random.default_rng(1)
    for it in range(300):
        h, w, c = int(rng.integers(1, 80)), int(rng.choice([5, 20, 400])), int(rng.choice([1, 3, 4]))
        a = rng.integers(0, 3, (h, w, c)).astype(np.uint8 if it % 2 else np.uint16)
        b = a.copy()
        for _ in range(int(rng.integers(0, 5))):
            b[rng.integers(0, h), rng.integers(0, w), rng.integers(0, c)] += 1
        if rng.random() < 0.3:
            b[rng.integers(0, h) :] += 1
        block = int(rng.choice([1, 2, 4, 8, 16]))
        ref = np.add.reduceat(core.changed_rows(a, b), np.arange(0, h, block)) > 0
        np.testing.assert_array_equal(core.changed_bands(a, b, block), ref)
