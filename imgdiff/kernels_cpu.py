"""Numba CPU kernels (``backend="numba"``): same inputs and outputs as the NumPy reference paths.

- :func:`block_max_numba`: the coarse max-pooled grid (``core.block_max_numpy``). Each row is compared
  8 bytes at a time through ``uint64`` views; a differing row gets its channel-max delta in one
  vectorised pass, then its blocks' maxima (dense differences, a JPEG pair, cost one such pass).
- :func:`exact_stats_numba`: exact mode in one pass, a tile row at a time: per image row the
  channel-max delta (contiguous, vectorised), then branch-free 16-px tile sums in int32 and per-column
  any-flags; each tile's exact box is read off the flags once per tile row. Same numbers as
  :func:`imgdiff.exact_tiles.exact_stats_numpy`.
- :func:`robust_sums_numba`: robust pass 1 over uint8/uint16 data in one sweep: per-block signed
  sums ``S`` of the weak pixels, weak counts ``N``, and strong-tile flags; the range test runs only
  where ``max_c |d| > margin``. Robust mode's last step, the per-region judgement of the candidate
  tiles, runs in NumPy for every backend (:mod:`imgdiff.robust.verify`).

This module imports Numba at import time; :mod:`imgdiff.api` imports it only when the numba
backend is used, so ``import imgdiff`` stays Numba-free. Kernels are compiled with ``cache=True``
(set ``NUMBA_CACHE_DIR`` to a writable folder).
"""

from __future__ import annotations

import numba
import numpy as np

from imgdiff.regions import TILE, TileStats, empty_stats


@numba.njit(cache=True, nogil=True)
def _block_max_rows(a2, b2, a64, b64, c, block, grid):  # pragma: no cover - compiled
    """Rows with equal bytes are skipped 8 bytes at a time; a differing row gets its channel-max delta
    in one vectorised pass (:func:`_row_delta`) and its blocks' maxima."""
    h = a2.shape[0]
    w = a2.shape[1] // c
    skip_rows = a64.shape[1] > 0
    rowe = np.zeros(a2.shape[1], a2.dtype)
    rowd = np.zeros(w, a2.dtype)
    for y in range(h):
        if skip_rows and not _row_differs(a64, b64, y):
            continue
        _row_delta(a2[y], b2[y], c, rowe, rowd)
        gy = y // block
        for g in range(grid.shape[1]):
            m = grid[gy, g]
            for x in range(g * block, min(w, g * block + block)):
                m = max(m, np.uint32(rowd[x]))
            grid[gy, g] = m


def block_max_numba(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """(Hb, Wb) uint32 max-pooled per-pixel delta of a normalised pair (H, W, C)."""
    h, w, c = a.shape
    a2, b2 = a.reshape(h, w * c), b.reshape(h, w * c)  # (H, W*C) elements
    a64, b64 = _word_views(a2, b2)
    grid = np.zeros((-(-h // block), -(-w // block)), dtype=np.uint32)
    _block_max_rows(a2, b2, a64, b64, c, block, grid)
    return grid


@numba.njit(cache=True, nogil=True, inline="always")
def _strong(a2, b2, c, h, w, y, x, r, margin):  # pragma: no cover - compiled
    """Both-sides range test at (y, x): window (2r+1)^2 clipped to the image; margin in raw units."""
    ylo, yhi, xlo, xhi = max(y - r, 0), min(y + r, h - 1), max(x - r, 0), min(x + r, w - 1)
    for ch in range(c):
        va, vb = np.int64(a2[y, x * c + ch]), np.int64(b2[y, x * c + ch])
        amin = amax = va
        bmin = bmax = vb
        for yy in range(ylo, yhi + 1):
            for xx in range(xlo, xhi + 1):
                pa, pb = np.int64(a2[yy, xx * c + ch]), np.int64(b2[yy, xx * c + ch])
                amin, amax = min(amin, pa), max(amax, pa)
                bmin, bmax = min(bmin, pb), max(bmax, pb)
        if vb - amax > margin or amin - vb > margin or va - bmax > margin or bmin - va > margin:
            return True
    return _in_strong_block(a2, b2, c, h, w, y, x, margin)


@numba.njit(cache=True, nogil=True, inline="always")
def _absmax(a2, b2, c, y, x):  # pragma: no cover - compiled
    ad = np.int64(0)
    for ch in range(c):
        ad = max(ad, abs(np.int64(a2[y, x * c + ch]) - np.int64(b2[y, x * c + ch])))
    return ad


@numba.njit(cache=True, nogil=True)
def _in_strong_block(a2, b2, c, h, w, y, x, margin):  # pragma: no cover - compiled
    """(y, x) lies in a (clipped) 3x3 window whose every pixel has ``max_c |d| > margin``: the 3x3
    morphological opening of the strong-delta mask (a coherent block, not an edge shift)."""
    for cy in range(max(y - 1, 0), min(y + 1, h - 1) + 1):
        for cx in range(max(x - 1, 0), min(x + 1, w - 1) + 1):
            full = True
            for yy in range(max(cy - 1, 0), min(cy + 1, h - 1) + 1):
                for xx in range(max(cx - 1, 0), min(cx + 1, w - 1) + 1):
                    if _absmax(a2, b2, c, yy, xx) <= margin:
                        full = False
                        break
                if not full:
                    break
            if full:
                return True
    return False


@numba.njit(cache=True, nogil=True, inline="always")
def _row_differs(a64, b64, y):  # pragma: no cover - compiled
    for k in range(a64.shape[1]):
        if a64[y, k] != b64[y, k]:
            return True
    return False


def _word_views(a2: np.ndarray, b2: np.ndarray):
    """(H, n) uint64 views of the rows when their byte length allows it, else (H, 0) (never skip)."""
    if a2.shape[1] * a2.itemsize % 8 == 0:
        return a2.view(np.uint64), b2.view(np.uint64)
    empty = np.zeros((a2.shape[0], 0), np.uint64)
    return empty, empty


@numba.njit(cache=True, nogil=True)
def _row_delta(ra, rb, c, rowe, rowd):  # pragma: no cover - compiled
    """rowd[x] = max_c |ra - rb| for one row (contiguous loops the compiler vectorises)."""
    for e in range(ra.shape[0]):
        rowe[e] = max(ra[e], rb[e]) - min(ra[e], rb[e])
    w = ra.shape[0] // c
    if c == 1:
        for x in range(w):
            rowd[x] = rowe[x]
    elif c == 3:
        for x in range(w):
            rowd[x] = max(max(rowe[3 * x], rowe[3 * x + 1]), rowe[3 * x + 2])
    else:
        for x in range(w):
            rowd[x] = max(max(rowe[4 * x], rowe[4 * x + 1]), max(rowe[4 * x + 2], rowe[4 * x + 3]))


@numba.njit(cache=True, nogil=True)
def _exact_stats(a2, b2, a64, b64, c, thr, boxes, count, total, peak, box):  # pragma: no cover
    """One fused pass, a tile row (``TILE`` image rows) at a time; rows with equal bytes are skipped
    8 bytes at a time. Per row: the channel-max delta (vectorised), ignored pixels zeroed, then
    branch-free 16-px tile sums in int32 (count, delta sum, max) and per-column / per-tile-row
    any-flags; each tile's exact box comes from those flags once per tile row (no per-pixel min/max)."""
    h = a2.shape[0]
    nb = boxes.shape[0]
    wt = count.shape[1]
    skip_rows = a64.shape[1] > 0
    rowe = np.zeros(a2.shape[1], a2.dtype)
    rowd = np.zeros(wt * TILE, a2.dtype)  # padded to whole tiles; the pad stays 0
    colany = np.zeros(wt * TILE, np.int32)
    cnt = np.zeros(wt, np.int32)
    tot = np.zeros(wt, np.int32)  # <= 256 px x 65535: fits
    pk = np.zeros(wt, np.int32)
    ylo = np.zeros(wt, np.int64)
    yhi = np.zeros(wt, np.int64)
    for ty in range(count.shape[0]):
        used = False
        for y in range(ty * TILE, min(h, ty * TILE + TILE)):
            if skip_rows and not _row_differs(a64, b64, y):
                continue
            if not used:
                colany[:] = 0
                cnt[:] = 0
                tot[:] = 0
                pk[:] = 0
                ylo[:] = h
                yhi[:] = -1
                used = True
            _row_delta(a2[y], b2[y], c, rowe, rowd)
            for k in range(nb):  # ignored pixels of this row: delta 0, never a change
                if boxes[k, 1] <= y <= boxes[k, 3]:
                    rowd[boxes[k, 0] : boxes[k, 2] + 1] = 0
            for tx in range(wt):
                s = np.int32(0)
                t = np.int32(0)
                p = np.int32(0)
                for i in range(TILE):
                    x = tx * TILE + i
                    on = np.int32(rowd[x] > thr)
                    dv = np.int32(rowd[x]) * on
                    colany[x] |= on
                    s += on
                    t += dv
                    p = max(p, dv)
                if s:
                    cnt[tx] += s
                    tot[tx] += t
                    pk[tx] = max(pk[tx], p)
                    ylo[tx] = min(ylo[tx], y)
                    yhi[tx] = y
        if not used:
            continue
        for tx in range(wt):
            if cnt[tx] == 0:
                continue
            x0 = tx * TILE
            while colany[x0] == 0:
                x0 += 1
            x1 = tx * TILE + TILE - 1
            while colany[x1] == 0:
                x1 -= 1
            count[ty, tx], total[ty, tx], peak[ty, tx] = cnt[tx], tot[tx], pk[tx]
            box[ty, tx, 0], box[ty, tx, 1], box[ty, tx, 2], box[ty, tx, 3] = x0, ylo[tx], x1, yhi[tx]


def exact_stats_numba(a: np.ndarray, b: np.ndarray, *, thr: int, boxes: np.ndarray) -> TileStats:
    """Exact-mode :class:`TileStats` of a normalised pair in one fused pass (no grid, no mask)."""
    h, w, c = a.shape
    a2, b2 = a.reshape(h, w * c), b.reshape(h, w * c)
    a64, b64 = _word_views(a2, b2)
    st = empty_stats(h, w)
    thr = min(int(thr), int(np.iinfo(a.dtype).max))  # above the dtype's max nothing can change
    _exact_stats(a2, b2, a64, b64, c, thr, boxes, st.count, st.total, st.peak, st.box)
    return st


@numba.njit(cache=True, nogil=True)
def _take_out_strong(a2, b2, c, y, x0, x1, bs, r, margin, acc, N, strong_tiles):  # pragma: no cover
    """Row ``y``: remove the strong pixels' deltas from ``acc`` and their count from ``N``."""
    h = a2.shape[0]
    w = a2.shape[1] // c
    ra, rb = a2[y], b2[y]
    for x in range(x0, x1):
        ad = np.int64(0)
        for ch in range(c):
            ad = max(ad, abs(np.int64(rb[x * c + ch]) - np.int64(ra[x * c + ch])))
        if ad > margin and _strong(a2, b2, c, h, w, y, x, r, margin):
            for ch in range(c):
                acc[x * c + ch] -= np.int32(rb[x * c + ch]) - np.int32(ra[x * c + ch])
            N[y // bs, x // bs] -= 1
            strong_tiles[y // TILE, x // TILE] = True


@numba.njit(cache=True, nogil=True, parallel=True)
def _robust_sums(a2, b2, a64, b64, c, y0, y1, x0, x1, bs, r, margin, S, N, strong_tiles):  # noqa: PLR0913
    """Per block row: column sums of signed deltas over its image rows (a contiguous, vectorisable
    loop), then strong pixels (only in rows whose max |d| exceeds the margin) are taken back out by
    a separate (not inlined) function, which keeps the hot loops small enough to vectorise. Block rows
    run in parallel (``prange``): each has its own accumulator and writes only its own rows of ``S``
    and ``N``; two block rows may both set one strong tile to True, which is the same store."""
    e0, e1 = x0 * c, x1 * c
    skip_rows = a64.shape[1] > 0
    by0, by1 = y0 // bs, (y1 + bs - 1) // bs
    for t in numba.prange(by1 - by0):
        by = by0 + t
        acc = np.zeros(a2.shape[1], np.int32)  # <= 16 rows of 16-bit deltas: fits
        used = False
        for y in range(max(by * bs, y0), min(by * bs + bs, y1)):
            if skip_rows and not _row_differs(a64, b64, y):
                continue
            used = True
            ra, rb, ac = a2[y, e0:e1], b2[y, e0:e1], acc[e0:e1]
            for e in range(e1 - e0):  # from 0: no negative-index wraparound check, so it vectorises
                ac[e] += np.int32(rb[e]) - np.int32(ra[e])
            mx = ra[0] - ra[0]
            for e in range(e1 - e0):
                mx = max(mx, max(ra[e], rb[e]) - min(ra[e], rb[e]))
            if mx > margin:
                _take_out_strong(a2, b2, c, y, x0, x1, bs, r, margin, acc, N, strong_tiles)
        if used:
            for bx in range(x0 // bs, (x1 + bs - 1) // bs):
                for x in range(max(bx * bs, x0), min(bx * bs + bs, x1)):
                    for ch in range(c):
                        S[by, bx, ch] += acc[x * c + ch]


def robust_sums_numba(a, b, crop, *, block, window, margin):
    """Robust pass 1 on the crop (y0, y1, x0, x1): ``S`` (Hb, Wb, C), ``N`` (Hb, Wb), strong tiles.

    Rows whose bytes are equal are skipped 8 bytes at a time, so the crop may be the whole image."""
    from imgdiff.robust import init_sums

    h, w, c = a.shape
    S, N = init_sums(h, w, c, block)
    tiles = np.zeros((-(-h // TILE), -(-w // TILE)), np.bool_)
    y0, y1, x0, x1 = crop
    a2, b2 = a.reshape(h, w * c), b.reshape(h, w * c)
    a64, b64 = _word_views(a2, b2)
    _robust_sums(a2, b2, a64, b64, c, y0, y1, x0, x1, block, window // 2, float(margin), S, N, tiles)
    return S, N, tiles
