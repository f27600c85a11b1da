"""Backend parity: NumPy reference vs Numba CPU (hypothesis, golden cases) and CUDA under the simulator."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import imgdiff
from imgdiff import core
from imgdiff.api import resolve_backend
from tests.imgdiff.cases import CASE_NAMES, make_case


@st.composite
def pairs(draw):
    h, w = draw(st.integers(1, 60)), draw(st.integers(1, 60))
    c = draw(st.sampled_from([1, 3, 4]))
    dtype = draw(st.sampled_from([np.uint8, np.uint16]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a = rng.integers(0, np.iinfo(dtype).max + 1, (h, w, c)).astype(dtype)
    b = a.copy()
    b[rng.random(a.shape) < draw(st.sampled_from([0.0, 0.002, 0.05, 1.0]))] = rng.integers(0, 256)
    return a, b


@settings(max_examples=120, deadline=None)
@given(pairs(), st.sampled_from([4, 16]))
def test_numba_grid_matches_numpy(pair, block):
    from imgdiff.kernels_cpu import block_max_numba

    a, b = pair
    np.testing.assert_array_equal(block_max_numba(a, b, block), core.block_max_numpy(a, b, block))


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(pairs(), st.sampled_from(["exact", "robust"]))
def test_numba_diff_matches_numpy(pair, mode):
    a, b = pair
    assert imgdiff.diff(a, b, mode=mode, backend="numba") == imgdiff.diff(a, b, mode=mode, backend="numpy")


@settings(max_examples=40, deadline=None)
@given(pairs(), st.sampled_from([0.0, 3.0, 40.0]), st.integers(0, 40))
def test_numba_exact_with_ignore_and_gap_matches_numpy(pair, thr, gap):
    a, b = pair
    kw = dict(mode="exact", threshold=thr, merge_gap=gap, ignore=[(2, 1, 9, 30)])
    assert imgdiff.diff(a, b, backend="numba", **kw) == imgdiff.diff(a, b, backend="numpy", **kw)


@pytest.fixture(scope="module")
def golden():
    return [make_case(n, h=192, w=256, seed=3) for n in CASE_NAMES]


@pytest.mark.parametrize("mode", ["exact", "robust"])
def test_numba_matches_numpy_on_golden_cases(golden, mode):
    """Photo-like pairs exercise the robust pyramid, texture sums and the strong test."""
    for c in golden:
        ref = imgdiff.diff(c.a, c.b, mode=mode, backend="numpy")
        assert imgdiff.diff(c.a, c.b, mode=mode, backend="numba") == ref, c.name
    c = golden[CASE_NAMES.index("jpeg_q90_bump")]
    kw = dict(mode=mode, ignore=[(60, 40, 120, 70)], merge_gap=40, threshold=1.0)
    assert imgdiff.diff(c.a, c.b, backend="numba", **kw) == imgdiff.diff(c.a, c.b, backend="numpy", **kw)


def test_robust_sums_numba_match_numpy(golden):
    from imgdiff import robust
    from imgdiff.kernels_cpu import robust_sums_numba

    prm = robust.RobustParams()
    for c in golden:
        a, b, scale = core.normalise_pair(c.a, c.b)
        h, w, _ = a.shape
        m = robust.margin_raw(prm, scale)
        ref = robust.block_sums_numpy(a, b, (0, h, 0, w), prm, m)
        got = robust_sums_numba(a, b, (0, h, 0, w), block=prm.block, window=prm.window, margin=m)
        for x, y in zip(got, ref):
            np.testing.assert_array_equal(x, y, err_msg=c.name)


def test_auto_backend_only_uses_numba_when_loaded():
    code = "from imgdiff.api import resolve_backend; print(resolve_backend('auto'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "numpy"
    import numba  # noqa: F401

    assert resolve_backend("auto") == "numba"


def test_cuda_without_gpu_is_a_clear_error():
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a GPU is present")
    a = np.zeros((4, 4), np.uint8)
    with pytest.raises(RuntimeError, match="backend 'cuda' needs an NVIDIA GPU"):
        imgdiff.diff(a, a, backend="cuda")


CUDASIM = r"""
import numpy as np, imgdiff
from imgdiff import core
from tests.imgdiff.cases import make_case
from imgdiff.kernels_cuda import block_max_cuda
rng = np.random.default_rng(0)
for shape, dt in [((9, 13, 3), np.uint8), ((6, 5, 4), np.uint16), ((5, 17, 1), np.uint8)]:
    a = rng.integers(0, 256, shape).astype(dt)
    b = a.copy()
    b[rng.random(shape) < 0.1] = 3
    assert (block_max_cuda(a, b, 4) == core.block_max_numpy(a, b, 4)).all(), shape
    for mode in ("exact", "robust"):
        ref = imgdiff.diff(a, b, mode=mode, backend="numpy", ignore=[(1, 1, 3, 2)])
        assert imgdiff.diff(a, b, mode=mode, backend="cuda", ignore=[(1, 1, 3, 2)]) == ref, (shape, mode)
c = make_case("jpeg_q90_patch", h=24, w=40)  # weak/strong mix through the robust pyramid
for mode in ("exact", "robust"):
    ref = imgdiff.diff(c.a, c.b, mode=mode, backend="numpy")
    assert imgdiff.diff(c.a, c.b, mode=mode, backend="cuda") == ref, mode
a = rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)  # coherent strong block on noise
b = a.copy()
b[5:10, 10:18] ^= 0x80
assert imgdiff.diff(a, b, backend="cuda") == imgdiff.diff(a, b, backend="numpy"), "strong block"
assert imgdiff.diff(a, b, backend="cuda").changed_pixels == 40
print("ok")
"""


@pytest.mark.slow
def test_cuda_kernel_under_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run(
        [sys.executable, "-c", CUDASIM], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
