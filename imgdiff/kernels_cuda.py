"""CUDA kernel (numba.cuda) for the coarse grid: same signature and output as ``core.block_max_numpy``.

One thread per element of the ``(H, W*C)`` view; equal elements exit at once, others
``atomic.max`` their absolute delta into the ``uint32`` tile grid. Tested on the CPU under
``NUMBA_ENABLE_CUDASIM=1`` (which must be set before Numba is imported). This module is imported
only when ``backend="cuda"`` is asked for.
"""

from __future__ import annotations

import numpy as np
from numba import cuda  # module-level: the simulator swaps this global inside kernels

_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:

        @cuda.jit
        def block_max_elems(a2, b2, c, block, grid):
            y, e = cuda.grid(2)
            if y < a2.shape[0] and e < a2.shape[1]:
                x, z = a2[y, e], b2[y, e]
                if x != z:
                    d = np.uint32(x - z) if x > z else np.uint32(z - x)
                    cuda.atomic.max(grid, (y // block, (e // c) // block), d)

        _KERNEL = block_max_elems
    return _KERNEL


def block_max_cuda(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """(Hb, Wb) uint32 max-pooled per-pixel delta of a normalised pair (H, W, C), on the GPU."""
    if not cuda.is_available():
        raise RuntimeError(
            "backend 'cuda' needs an NVIDIA GPU with a working CUDA driver, but numba.cuda.is_available() "
            "is False here; use backend='numba', 'numpy' or 'auto'"
        )
    h, w, c = a.shape
    a2, b2 = a.reshape(h, w * c), b.reshape(h, w * c)  # (H, W*C)
    grid = cuda.to_device(np.zeros((-(-h // block), -(-w // block)), dtype=np.uint32))
    threads = (8, 32)
    blocks = (-(-h // threads[0]), -(-(w * c) // threads[1]))
    _kernel()[blocks, threads](cuda.to_device(a2), cuda.to_device(b2), c, block, grid)
    return grid.copy_to_host()
