"""The few OpenCV operations the diff uses, in NumPy for small arrays (so a small diff never imports
OpenCV, ~18 ms of CPU and ~1,300 page faults per process) and in OpenCV for large ones.

Both give the same answer on every input (``tests/imgdiff/test_morph.py``):

- :func:`absdiff`: ``|a - b|`` per element, in the inputs' unsigned dtype.
- :func:`dilate` / :func:`erode`: max / min over a ``k x k`` window anchored like OpenCV's kernel
  anchor (default: centred), with OpenCV's default border (pixels outside the image are ignored,
  i.e. the window is clipped). A rectangular window is separable, so the NumPy path takes the
  clipped running max/min along the rows, then along the columns (``k - 1`` shifted passes each).
- :func:`open3`: ``dilate(erode(x, 3), 3)`` (OpenCV's ``MORPH_OPEN`` with a 3x3 kernel).
- :func:`components8`: 8-connected components of a 0/1 ``uint8`` image as ``(n, labels)``, label 0
  the background and ``1..n-1`` the components (the NumPy path numbers them in raster order of
  their first pixel; callers use only the partition).

OpenCV is used when the array is large (:data:`SMALL` elements or more, or a ``work`` hint of the
total size of many small calls), or when it is already imported.
"""

from __future__ import annotations

import os
import sys

import numpy as np

SMALL = 1 << 20
"""Arrays (or calls' total ``work``) of at least this many elements go to OpenCV."""
SMALL_COMPONENTS = 4096
"""Images with more foreground pixels than this are labelled by OpenCV."""


def cv2():
    """The OpenCV module, imported on first use with its logging silenced."""
    if "cv2" not in sys.modules:
        os.environ.setdefault("OPENCV_LOG_LEVEL", "SILENT")
    import cv2 as module

    return module


def _opencv(size: int) -> bool:
    return size >= SMALL or "cv2" in sys.modules


def absdiff(a: np.ndarray, b: np.ndarray, *, work: int = 0) -> np.ndarray:
    """``|a - b|`` of two same-shape unsigned arrays (2-D for OpenCV's sake, or any shape in NumPy)."""
    if _opencv(max(a.size, work)):
        return cv2().absdiff(a, b)
    return np.subtract(np.maximum(a, b), np.minimum(a, b))


def transpose(x: np.ndarray) -> np.ndarray:
    """Contiguous transpose of a 2-D array (OpenCV's blocked transpose for large arrays)."""
    if _opencv(x.size):
        return cv2().transpose(x)
    return np.ascontiguousarray(x.T)


def _clipped(x: np.ndarray, op, lo: int, hi: int, axis: int) -> np.ndarray:
    """``out[p] = op over x[p + d]`` for ``d`` in ``[lo, hi]`` along ``axis``, positions outside ignored."""
    out = x.copy()
    n = x.shape[axis]
    for d in range(lo, hi + 1):
        if d == 0 or abs(d) >= n:
            continue
        dst = [slice(None)] * x.ndim
        src = [slice(None)] * x.ndim
        dst[axis], src[axis] = (slice(0, n - d), slice(d, n)) if d > 0 else (slice(-d, n), slice(0, n + d))
        view = out[tuple(dst)]
        op(view, x[tuple(src)], out=view)
    return out


def _window(x: np.ndarray, op, k: int, anchor: tuple[int, int] | None) -> np.ndarray:
    ax, ay = (k // 2, k // 2) if anchor is None else anchor
    return _clipped(_clipped(x, op, -ay, k - 1 - ay, 0), op, -ax, k - 1 - ax, 1)


def dilate(x: np.ndarray, k: int, anchor: tuple[int, int] | None = None) -> np.ndarray:
    """Max over the ``k x k`` window (``anchor`` = (x, y) as in OpenCV), clipped to the image; same shape."""
    if _opencv(x.size):
        kernel = np.ones((k, k), np.uint8)
        out = cv2().dilate(x, kernel) if anchor is None else cv2().dilate(x, kernel, anchor=anchor)
        return out.reshape(x.shape)  # OpenCV drops a trailing channel axis of 1
    return _window(x, np.maximum, k, anchor)


def erode(x: np.ndarray, k: int) -> np.ndarray:
    """Min over the centred ``k x k`` window, clipped to the image; same shape."""
    if _opencv(x.size):
        return cv2().erode(x, np.ones((k, k), np.uint8)).reshape(x.shape)
    return _window(x, np.minimum, k, None)


def open3(x: np.ndarray) -> np.ndarray:
    """3x3 morphological opening (erode, then dilate), windows clipped to the image."""
    if _opencv(x.size):
        module = cv2()
        return module.morphologyEx(x, module.MORPH_OPEN, np.ones((3, 3), np.uint8))
    return _window(_window(x, np.minimum, 3, None), np.maximum, 3, None)


def components8(work: np.ndarray) -> tuple[int, np.ndarray]:
    """``(n, labels)``: 8-connected components of a 2-D 0/1 uint8 image; labels (H, W) int32."""
    ys, xs = np.nonzero(work)
    if _opencv(work.size) or ys.size > SMALL_COMPONENTS:
        module = cv2()
        return module.connectedComponents(work, connectivity=8, ltype=module.CV_32S)
    at = {p: i for i, p in enumerate(zip(ys.tolist(), xs.tolist()))}  # raster order
    parent = list(range(len(at)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for (y, x), i in at.items():
        for q in ((y, x - 1), (y - 1, x - 1), (y - 1, x), (y - 1, x + 1)):  # neighbours seen before
            j = at.get(q)
            if j is not None:
                ri, rj = root(i), root(j)
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
    number: dict[int, int] = {}
    lab = [number.setdefault(root(i), len(number) + 1) for i in range(len(parent))]
    labels = np.zeros(work.shape, np.int32)
    labels[ys, xs] = lab
    return len(number) + 1, labels
