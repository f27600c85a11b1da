"""CUDA kernels (numba.cuda, ``backend="cuda"``): the same block-grid + refine scheme as the CPU kernels.

Every kernel runs one CUDA thread block of 16x16 threads per image block and reduces in shared memory:

- :func:`block_max_cuda`: the coarse max-pooled grid (one thread block per ``block``-px tile; a
  thread reads the pixels ``(ty + 16 i, tx + 16 j)`` of its tile, then a shared-memory max tree).
- :func:`robust_sums_cuda`: robust pass 1, one thread block per level-0 block of the crop: signed
  sums ``S`` per channel of the weak pixels and the strong-pixel count (shared-memory sum trees),
  with the both-sides range test only where ``max_c |d| > margin``.
- :func:`tile_stats_cuda`: the fused refine pass, one thread block per candidate 16-px tile (a
  thread per pixel): changed count, raw delta sum and max, and the exact pixel box by shared-memory
  sum/max/min trees: the exact mode's refine pass (``area`` gates ``max_c |d| > thr``; a finite
  ``margin`` adds the both-sides strong test).

The pyramid, the per-block texture and the per-region judgement of robust mode run on the host (NumPy,
shared by every backend, on the candidate tiles only); pass 1's integer sums are bit-identical to the
NumPy and Numba backends'. Tested on the
CPU under ``NUMBA_ENABLE_CUDASIM=1`` (set before Numba is imported); this module is imported only
when ``backend="cuda"`` is asked for.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint32  # module-level: the simulator swaps these globals inside kernels

from imgdiff.regions import TILE, TileStats, empty_stats

T = 16
"""Threads per side of a CUDA thread block."""
NT = 256
"""Threads per CUDA thread block (T*T; a literal: shared-array shapes must be compile-time constants)."""


def _require_gpu() -> None:
    if not cuda.is_available():
        raise RuntimeError(
            "backend 'cuda' needs an NVIDIA GPU with a working CUDA driver, but numba.cuda.is_available() "
            "is False here; use backend='numba', 'numpy' or 'auto'"
        )


@cuda.jit(device=True)
def _pixel_absmax(a2, b2, c, y, x):  # pragma: no cover - device code
    ad = 0
    for ch in range(c):
        p, q = int(a2[y, x * c + ch]), int(b2[y, x * c + ch])
        dd = p - q if p > q else q - p
        if dd > ad:
            ad = dd
    return ad


@cuda.jit(device=True)
def _strong(a2, b2, c, h, w, y, x, r, margin):  # pragma: no cover - device code
    ylo, yhi, xlo, xhi = max(y - r, 0), min(y + r, h - 1), max(x - r, 0), min(x + r, w - 1)
    for ch in range(c):
        va, vb = int(a2[y, x * c + ch]), int(b2[y, x * c + ch])
        amin = amax = va
        bmin = bmax = vb
        for yy in range(ylo, yhi + 1):
            for xx in range(xlo, xhi + 1):
                pa, pb = int(a2[yy, xx * c + ch]), int(b2[yy, xx * c + ch])
                amin, amax = min(amin, pa), max(amax, pa)
                bmin, bmax = min(bmin, pb), max(bmax, pb)
        # Compare before subtracting: the pixel values may be unsigned on the device (no wrap-around).
        if (vb > amax and vb - amax > margin) or (amin > vb and amin - vb > margin):
            return True
        if (va > bmax and va - bmax > margin) or (bmin > va and bmin - va > margin):
            return True
    return _in_strong_block(a2, b2, c, h, w, y, x, margin)


@cuda.jit(device=True)
def _in_strong_block(a2, b2, c, h, w, y, x, margin):  # pragma: no cover - device code
    """(y, x) lies in a clipped 3x3 window of pixels that all have ``max_c |d| > margin``."""
    for cy in range(max(y - 1, 0), min(y + 1, h - 1) + 1):
        for cx in range(max(x - 1, 0), min(x + 1, w - 1) + 1):
            full = True
            for yy in range(max(cy - 1, 0), min(cy + 1, h - 1) + 1):
                for xx in range(max(cx - 1, 0), min(cx + 1, w - 1) + 1):
                    if _pixel_absmax(a2, b2, c, yy, xx) <= margin:
                        full = False
            if full:
                return True
    return False


@cuda.jit
def _block_max_kernel(a2, b2, c, block, grid):  # pragma: no cover - device code
    h = a2.shape[0]
    w = a2.shape[1] // c
    gy, gx = cuda.blockIdx.y, cuda.blockIdx.x
    ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
    tid = ty * T + tx
    buf = cuda.shared.array(NT, uint32)
    m = 0
    for yy in range(ty, block, T):
        for xx in range(tx, block, T):
            y, x = gy * block + yy, gx * block + xx
            if y < h and x < w:
                m = max(m, _pixel_absmax(a2, b2, c, y, x))
    buf[tid] = m
    cuda.syncthreads()
    s = NT // 2
    while s > 0:
        if tid < s:
            buf[tid] = max(buf[tid], buf[tid + s])
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        grid[gy, gx] = buf[0]


def block_max_cuda(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """(Hb, Wb) uint32 max-pooled per-pixel delta of a normalised pair (H, W, C), on the GPU."""
    _require_gpu()
    h, w, c = a.shape
    hb, wb = -(-h // block), -(-w // block)
    grid = cuda.device_array((hb, wb), np.uint32)
    a2, b2 = cuda.to_device(a.reshape(h, w * c)), cuda.to_device(b.reshape(h, w * c))
    _block_max_kernel[(wb, hb), (T, T)](a2, b2, c, block, grid)
    return grid.copy_to_host()


@cuda.jit
def _robust_sums_kernel(a2, b2, c, y0, x0, bs, r, margin, S, nstrong, strong_tiles):  # pragma: no cover
    h = a2.shape[0]
    w = a2.shape[1] // c
    by, bx = y0 // bs + cuda.blockIdx.y, x0 // bs + cuda.blockIdx.x
    ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
    tid = ty * T + tx
    sums = cuda.shared.array((4, NT), int64)
    cnt = cuda.shared.array(NT, int64)
    for ch in range(4):
        sums[ch, tid] = 0
    cnt[tid] = 0
    for yy in range(ty, bs, T):
        for xx in range(tx, bs, T):
            y, x = by * bs + yy, bx * bs + xx
            if y < h and x < w:
                ad = _pixel_absmax(a2, b2, c, y, x)
                if ad > margin and _strong(a2, b2, c, h, w, y, x, r, margin):
                    cnt[tid] += 1
                    strong_tiles[y // TILE, x // TILE] = True
                elif ad > 0:
                    for ch in range(c):
                        p, q = int(a2[y, x * c + ch]), int(b2[y, x * c + ch])
                        if q >= p:  # signed delta without unsigned wrap-around
                            sums[ch, tid] += q - p
                        else:
                            sums[ch, tid] -= p - q
    cuda.syncthreads()
    s = NT // 2
    while s > 0:
        if tid < s:
            for ch in range(4):
                sums[ch, tid] += sums[ch, tid + s]
            cnt[tid] += cnt[tid + s]
        cuda.syncthreads()
        s //= 2
    if tid == 0 and by < S.shape[0] and bx < S.shape[1]:
        for ch in range(c):
            S[by, bx, ch] = sums[ch, 0]
        nstrong[by, bx] = cnt[0]


def robust_sums_cuda(a, b, crop, *, block, window, margin):
    """Robust pass 1 on the crop (y0, y1, x0, x1): ``S`` (Hb, Wb, C), ``N`` (Hb, Wb), strong tiles."""
    from imgdiff.robust import init_sums

    _require_gpu()
    h, w, c = a.shape
    S, N = init_sums(h, w, c, block)
    y0, y1, x0, x1 = crop
    dS, dn = cuda.to_device(S), cuda.to_device(np.zeros(N.shape, np.int64))
    dt = cuda.to_device(np.zeros((-(-h // TILE), -(-w // TILE)), np.bool_))
    nby, nbx = -(-y1 // block) - y0 // block, -(-x1 // block) - x0 // block
    a2, b2 = cuda.to_device(a.reshape(h, w * c)), cuda.to_device(b.reshape(h, w * c))
    _robust_sums_kernel[(nbx, nby), (T, T)](a2, b2, c, y0, x0, block, window // 2, float(margin), dS, dn, dt)
    return dS.copy_to_host(), N - dn.copy_to_host(), dt.copy_to_host()


@cuda.jit
def _tile_stats_kernel(a2, b2, c, tys, txs, thr, area, ab, margin, r, boxes, count, total, peak, box):  # noqa: PLR0913
    h = a2.shape[0]
    w = a2.shape[1] // c
    ty_, tx_ = tys[cuda.blockIdx.x], txs[cuda.blockIdx.x]
    ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
    tid = ty * T + tx
    s_cnt = cuda.shared.array(NT, int64)
    s_tot = cuda.shared.array(NT, int64)
    s_pk = cuda.shared.array(NT, int64)
    s_box = cuda.shared.array((4, NT), int64)
    y, x = ty_ * TILE + ty, tx_ * TILE + tx
    hit = False
    ad = 0
    if y < h and x < w:
        ad = _pixel_absmax(a2, b2, c, y, x)
        if ad > 0:
            hit = ad > thr and area[y // ab, x // ab]
            if not hit and ad > margin:
                hit = _strong(a2, b2, c, h, w, y, x, r, margin)
            if hit:
                for k in range(boxes.shape[0]):
                    if boxes[k, 0] <= x and x <= boxes[k, 2] and boxes[k, 1] <= y and y <= boxes[k, 3]:
                        hit = False
    big = 1 << 62
    s_cnt[tid] = 1 if hit else 0
    s_tot[tid] = ad if hit else 0
    s_pk[tid] = ad if hit else 0
    s_box[0, tid] = x if hit else big
    s_box[1, tid] = y if hit else big
    s_box[2, tid] = x if hit else -1
    s_box[3, tid] = y if hit else -1
    cuda.syncthreads()
    s = NT // 2
    while s > 0:
        if tid < s:
            s_cnt[tid] += s_cnt[tid + s]
            s_tot[tid] += s_tot[tid + s]
            s_pk[tid] = max(s_pk[tid], s_pk[tid + s])
            s_box[0, tid] = min(s_box[0, tid], s_box[0, tid + s])
            s_box[1, tid] = min(s_box[1, tid], s_box[1, tid + s])
            s_box[2, tid] = max(s_box[2, tid], s_box[2, tid + s])
            s_box[3, tid] = max(s_box[3, tid], s_box[3, tid + s])
        cuda.syncthreads()
        s //= 2
    if tid == 0 and s_cnt[0] > 0:
        count[ty_, tx_] = s_cnt[0]
        total[ty_, tx_] = s_tot[0]
        peak[ty_, tx_] = s_pk[0]
        for k in range(4):
            box[ty_, tx_, k] = s_box[k, 0]


def tile_stats_cuda(a, b, tiles, *, thr, area, area_block, margin, window, boxes) -> TileStats:
    """:class:`TileStats` of the candidate ``tiles`` (Ht, Wt) bool on the GPU: a pixel counts when
    ``max_c |d| > thr`` and its ``area`` cell (of ``area_block`` px) is set, or when ``max_c |d| > margin``
    (raw, ``inf`` = off) and the ``window`` both-sides range test says strong; ``boxes`` (K, 4) int64
    inclusive ignore boxes never count."""
    _require_gpu()
    h, w, c = a.shape
    st = empty_stats(h, w)
    tys, txs = (v.astype(np.int64) for v in np.nonzero(tiles))
    if tys.size == 0:
        return st
    out = [cuda.to_device(x) for x in (st.count, st.total, st.peak, st.box)]
    a2, b2 = cuda.to_device(a.reshape(h, w * c)), cuda.to_device(b.reshape(h, w * c))
    d_area = cuda.to_device(np.ascontiguousarray(area))
    _tile_stats_kernel[tys.size, (T, T)](
        a2, b2, c, cuda.to_device(tys), cuda.to_device(txs), int(thr), d_area, int(area_block), float(margin),
        window // 2, cuda.to_device(boxes), *out,
    )  # fmt: skip
    return TileStats(*(x.copy_to_host() for x in out))
