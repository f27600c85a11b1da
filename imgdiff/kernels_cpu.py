"""Numba CPU kernels (``backend="numba"``): same inputs and outputs as the NumPy reference paths.

- :func:`block_max_numba`: the coarse max-pooled grid (``core.block_max_numpy``). Each row is compared
  8 bytes at a time through ``uint64`` views; only differing words are expanded into per-element
  deltas.
- :func:`tile_stats_numba`: the fused refine pass. It reads only the pixels of the candidate tiles
  and accumulates, per tile, changed pixels, sum/max of raw deltas and the exact pixel box
  (:class:`imgdiff.regions.TileStats`); no mask or delta image is materialised. A pixel is changed
  when ``max_c |d| > thr`` and its ``area`` cell is set, or (robust mode) when ``max_c |d| > margin``
  and the both-sides range test says strong; pixels in ignore boxes never count.
- :func:`robust_sums_numba`: robust pass 1 over uint8/uint16 data in one sweep: per-block signed
  sums ``S`` of the weak pixels, weak counts ``N``, and strong-tile flags; the range test runs only
  where ``max_c |d| > margin``.

This module imports Numba at import time; :mod:`imgdiff.api` imports it only when the numba
backend is used, so ``import imgdiff`` stays Numba-free. Kernels are compiled with ``cache=True``
(set ``NUMBA_CACHE_DIR`` to a writable folder).
"""

from __future__ import annotations

import numba
import numpy as np

from imgdiff.regions import TILE, TileStats, empty_stats


@numba.njit(cache=True, nogil=True)
def _block_max_words(a2, b2, a64, b64, c, block, per_word, grid):  # pragma: no cover - compiled
    h, n = a2.shape
    nw = a64.shape[1]
    for y in range(h):
        gy = y // block
        for k in range(nw):
            if a64[y, k] != b64[y, k]:
                for e in range(k * per_word, (k + 1) * per_word):
                    x, z = np.int64(a2[y, e]), np.int64(b2[y, e])
                    d = x - z if x > z else z - x
                    g = (e // c) // block
                    if d > grid[gy, g]:
                        grid[gy, g] = d
        for e in range(nw * per_word, n):  # tail (rows whose bytes are not a multiple of 8)
            x, z = np.int64(a2[y, e]), np.int64(b2[y, e])
            if x != z:
                d = x - z if x > z else z - x
                g = (e // c) // block
                if d > grid[gy, g]:
                    grid[gy, g] = d


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
    _block_max_words(a2, b2, a64, b64, c, block, 8 // a.itemsize, grid)
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


@numba.njit(cache=True, nogil=True)
def _tile_stats(a2, b2, c, tys, txs, thr, area, ab, margin, r, boxes, count, total, peak, box):  # noqa: PLR0913
    h = a2.shape[0]
    w = a2.shape[1] // c
    nb = boxes.shape[0]
    for t in range(tys.shape[0]):
        ty, tx = tys[t], txs[t]
        y0, x0 = ty * TILE, tx * TILE
        y1, x1 = min(h, y0 + TILE), min(w, x0 + TILE)
        cnt = 0
        tot = 0
        pk = 0
        bx0, by0, bx1, by1 = x1, y1, -1, -1
        for y in range(y0, y1):
            for x in range(x0, x1):
                ad = np.int64(0)
                for ch in range(c):
                    p, q = np.int64(a2[y, x * c + ch]), np.int64(b2[y, x * c + ch])
                    dd = p - q if p > q else q - p
                    if dd > ad:
                        ad = dd
                if ad == 0:
                    continue
                hit = ad > thr and area[y // ab, x // ab]
                if not hit and ad > margin:
                    hit = _strong(a2, b2, c, h, w, y, x, r, margin)
                if not hit:
                    continue
                skip = False
                for k in range(nb):
                    if boxes[k, 0] <= x <= boxes[k, 2] and boxes[k, 1] <= y <= boxes[k, 3]:
                        skip = True
                        break
                if skip:
                    continue
                cnt += 1
                tot += ad
                pk = max(pk, ad)
                bx0, by0, bx1, by1 = min(bx0, x), min(by0, y), max(bx1, x), max(by1, y)
        if cnt:
            count[ty, tx], total[ty, tx], peak[ty, tx] = cnt, tot, pk
            box[ty, tx, 0], box[ty, tx, 1], box[ty, tx, 2], box[ty, tx, 3] = bx0, by0, bx1, by1


def tile_stats_numba(a, b, tiles, *, thr, area, area_block, margin, window, boxes) -> TileStats:
    """:class:`TileStats` of the candidate ``tiles`` (Ht, Wt) bool of a normalised pair (H, W, C).

    ``thr``: raw threshold; ``area`` (bool grid of ``area_block``-px cells) gates the ``> thr`` rule;
    ``margin`` (raw, ``inf`` = off) and ``window`` drive the strong test; ``boxes`` (K, 4) int64
    inclusive ignore boxes.
    """
    h, w, c = a.shape
    st = empty_stats(h, w)
    tys, txs = np.nonzero(tiles)
    _tile_stats(
        a.reshape(h, w * c), b.reshape(h, w * c), c, tys, txs, int(thr), area, int(area_block),
        float(margin), window // 2, boxes, st.count, st.total, st.peak, st.box,
    )  # fmt: skip
    return st


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
def _exact_stats(a2, b2, a64, b64, c, thr, boxes, count, total, peak, box):  # pragma: no cover
    """One fused pass: rows with equal bytes are skipped 8 bytes at a time; other rows update tile stats
    once per 16-px row segment (local accumulators)."""
    h = a2.shape[0]
    w = a2.shape[1] // c
    nb = boxes.shape[0]
    skip_rows = a64.shape[1] > 0
    rowd = np.zeros(w, np.int64)
    rowe = np.zeros(a2.shape[1], a2.dtype)
    for y in range(h):
        if skip_rows and not _row_differs(a64, b64, y):
            continue
        ra, rb = a2[y], b2[y]
        for e in range(a2.shape[1]):  # contiguous |a - b| per element (vectorised)
            rowe[e] = max(ra[e], rb[e]) - min(ra[e], rb[e])
        if c == 1:
            for x in range(w):
                rowd[x] = rowe[x]
        else:
            for x in range(w):
                m = rowe[x * c]
                for ch in range(1, c):
                    m = max(m, rowe[x * c + ch])
                rowd[x] = m
        ty = y // TILE
        for tx in range(count.shape[1]):
            cnt = np.int64(0)
            tot = np.int64(0)
            pk = np.int64(0)
            xmin, xmax = w, -1
            for x in range(tx * TILE, min(w, tx * TILE + TILE)):
                ad = rowd[x]
                if ad <= thr:
                    continue
                skip = False
                for k in range(nb):
                    if boxes[k, 0] <= x <= boxes[k, 2] and boxes[k, 1] <= y <= boxes[k, 3]:
                        skip = True
                        break
                if skip:
                    continue
                cnt += 1
                tot += ad
                pk = max(pk, ad)
                xmin = min(xmin, x)
                xmax = x
            if cnt:
                count[ty, tx] += cnt
                total[ty, tx] += tot
                peak[ty, tx] = max(peak[ty, tx], pk)
                box[ty, tx, 0] = min(box[ty, tx, 0], xmin)
                box[ty, tx, 1] = min(box[ty, tx, 1], y)
                box[ty, tx, 2] = max(box[ty, tx, 2], xmax)
                box[ty, tx, 3] = max(box[ty, tx, 3], y)


def exact_stats_numba(a: np.ndarray, b: np.ndarray, *, thr: int, boxes: np.ndarray) -> TileStats:
    """Exact-mode :class:`TileStats` of a normalised pair in one fused pass (no grid, no mask)."""
    h, w, c = a.shape
    a2, b2 = a.reshape(h, w * c), b.reshape(h, w * c)
    a64, b64 = _word_views(a2, b2)
    st = empty_stats(h, w)
    _exact_stats(a2, b2, a64, b64, c, int(thr), boxes, st.count, st.total, st.peak, st.box)
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


@numba.njit(cache=True, nogil=True)
def _robust_sums(a2, b2, a64, b64, c, y0, y1, x0, x1, bs, r, margin, S, N, strong_tiles):  # noqa: PLR0913
    """Per block row: column sums of signed deltas over its image rows (a contiguous, vectorisable
    loop), then strong pixels (only in rows whose max |d| exceeds the margin) are taken back out by
    a separate (not inlined) function, which keeps the hot loops small enough to vectorise."""
    e0, e1 = x0 * c, x1 * c
    skip_rows = a64.shape[1] > 0
    acc = np.zeros(a2.shape[1], np.int32)  # <= 16 rows of 16-bit deltas: fits
    for by in range(y0 // bs, (y1 + bs - 1) // bs):
        used = False
        for y in range(max(by * bs, y0), min(by * bs + bs, y1)):
            if skip_rows and not _row_differs(a64, b64, y):
                continue
            if not used:
                acc[e0:e1] = 0
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
