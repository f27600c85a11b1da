"""imgdiff.morph: the NumPy paths equal OpenCV's operations exactly (windows clipped at the border)."""

import cv2
import numpy as np
import pytest

from imgdiff import morph


@pytest.fixture
def numpy_path(monkeypatch):
    """Force the NumPy implementations (OpenCV is imported in this test process)."""
    monkeypatch.setattr(morph, "_opencv", lambda size: False)


SHAPES = [(1, 1), (1, 7), (5, 1), (9, 13), (9, 13, 3), (6, 4, 4), (2, 2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_absdiff_dilate_erode_open(numpy_path, shape, dtype):
    rng = np.random.default_rng(sum(shape))
    top = np.iinfo(dtype).max
    a, b = (rng.integers(0, top + 1, shape, dtype=dtype) for _ in range(2))
    np.testing.assert_array_equal(morph.absdiff(a, b), cv2.absdiff(a, b).reshape(shape))
    for k in (1, 3, 5, 7):
        ones = np.ones((k, k), np.uint8)
        np.testing.assert_array_equal(morph.dilate(a, k), cv2.dilate(a, ones).reshape(shape))
        np.testing.assert_array_equal(morph.erode(a, k), cv2.erode(a, ones).reshape(shape))
    for g in (1, 2, 3):
        ones = np.ones((g + 1, g + 1), np.uint8)
        want = cv2.dilate(a, ones, anchor=(g, g)).reshape(shape)
        np.testing.assert_array_equal(morph.dilate(a, g + 1, anchor=(g, g)), want)
    mask = (a > top // 3).view(np.uint8) if dtype == np.uint8 else (a > top // 3).astype(np.uint8)
    if mask.ndim == 2:
        want = cv2.morphologyEx(mask, cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
        np.testing.assert_array_equal(morph.open3(mask), want)


def _partition(labels: np.ndarray) -> set:
    return {frozenset(zip(*np.nonzero(labels == k))) for k in np.unique(labels) if k}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("density", [0.1, 0.4, 0.7])
def test_components8_same_partition_as_opencv(numpy_path, seed, density):
    rng = np.random.default_rng(seed)
    work = (rng.random((int(rng.integers(1, 30)), int(rng.integers(1, 30)))) < density).astype(np.uint8)
    n, labels = morph.components8(work)
    n_cv, labels_cv = cv2.connectedComponents(work, connectivity=8, ltype=cv2.CV_32S)
    assert n == n_cv and labels.dtype == np.int32
    assert set(np.unique(labels[work > 0])) <= set(range(1, n))
    assert _partition(labels) == _partition(labels_cv)
    assert (labels[work == 0] == 0).all()


def test_large_arrays_use_opencv_small_ones_numpy(monkeypatch):
    calls = []
    monkeypatch.setattr(morph, "cv2", lambda: calls.append(1) or cv2)
    monkeypatch.setitem(morph.sys.modules, "cv2", None)  # as if not imported: decide on size alone
    monkeypatch.delitem(morph.sys.modules, "cv2")
    small = np.zeros((4, 4), np.uint8)
    morph.dilate(small, 3)
    morph.absdiff(small, small)
    assert calls == []
    morph.absdiff(small, small, work=morph.SMALL)  # many small calls: OpenCV
    big = np.zeros((1024, 1024), np.uint8)
    morph.dilate(big, 3)
    assert len(calls) == 2
