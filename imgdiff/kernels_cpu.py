"""Numba CPU kernel for the coarse grid: same signature and output as ``core.block_max_numpy``.

One pass over both images: each row is compared 8 bytes at a time through ``uint64`` views, and
only differing words are expanded into per-element absolute deltas, max-pooled into the
``block``-sized tile grid. Numba is imported lazily (``import imgdiff`` never loads it) and the
kernel is compiled with ``cache=True`` (set ``NUMBA_CACHE_DIR`` to a writable folder).
"""

from __future__ import annotations

import numpy as np

_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        import numba

        @numba.njit(cache=True, nogil=True)
        def block_max_words(a2, b2, a64, b64, c, block, per_word, grid):
            h, n = a2.shape
            nw = a64.shape[1]
            for y in range(h):
                gy = y // block
                for k in range(nw):
                    if a64[y, k] != b64[y, k]:
                        for e in range(k * per_word, (k + 1) * per_word):
                            x, z = a2[y, e], b2[y, e]
                            d = np.uint32(x - z) if x > z else np.uint32(z - x)
                            g = (e // c) // block
                            if d > grid[gy, g]:
                                grid[gy, g] = d
                for e in range(nw * per_word, n):  # tail (rows whose bytes are not a multiple of 8)
                    x, z = a2[y, e], b2[y, e]
                    if x != z:
                        d = np.uint32(x - z) if x > z else np.uint32(z - x)
                        g = (e // c) // block
                        if d > grid[gy, g]:
                            grid[gy, g] = d

        _KERNEL = block_max_words
    return _KERNEL


def block_max_numba(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """(Hb, Wb) uint32 max-pooled per-pixel delta of a normalised pair (H, W, C)."""
    h, w, c = a.shape
    a2, b2 = a.reshape(h, w * c), b.reshape(h, w * c)  # (H, W*C) elements
    row_bytes = w * c * a.itemsize
    if row_bytes % 8 == 0:
        a64, b64 = a2.view(np.uint64), b2.view(np.uint64)  # (H, row_bytes/8)
    else:
        a64 = b64 = np.zeros((h, 0), np.uint64)
    grid = np.zeros((-(-h // block), -(-w // block)), dtype=np.uint32)
    _kernel()(a2, b2, a64, b64, c, block, 8 // a.itemsize, grid)
    return grid
