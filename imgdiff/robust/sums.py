"""Robust pass 1 in NumPy: per-block signed sums of the weak pixels' deltas (exact integers), and the
crop and tile helpers around them."""

from __future__ import annotations

import numpy as np

from imgdiff.core import in_row_halves
from imgdiff.regions import TILE
from imgdiff.robust.blocks import _block_sum, _block_sum_diff
from imgdiff.robust.params import RobustParams
from imgdiff.robust.strong import strong_points


def block_sums_numpy(a: np.ndarray, b: np.ndarray, crop, params: RobustParams, margin: float, *, grid=None):
    """Pass 1 on the crop (y0, y1, x0, x1). Returns ``S`` (Hb, Wb, C) int32 (exact: at most
    ``16 * 16 * 65535``), ``N`` (Hb, Wb) int64, strong-tile flags (Ht, Wt) bool. Blocks outside the crop
    have ``S = 0`` and full ``N``.
    ``grid``: the (Ht, Wt) max-pooled raw ``|d|`` per tile when known (saves a pass, same result)."""
    h, w, c = a.shape
    bs = params.block
    S, N = init_sums(h, w, c, bs, np.int32)
    y0, y1, x0, x1 = crop
    A, B = a[y0:y1, x0:x1], b[y0:y1, x0:x1]  # (h', w', C)
    sl = (slice(y0 // bs, -(-y1 // bs)), slice(x0 // bs, -(-x1 // bs)))
    S[sl] = in_row_halves(_block_sum_diff, B, A, bs, unit=bs)  # (hb', wb', C) signed sums of all pixels
    tiles = np.zeros((-(-h // TILE), -(-w // TILE)), bool)
    ys, xs = strong_points(a, b, crop, window=params.window, margin=margin, grid=grid)
    if ys.size:  # take the strong pixels back out of the sums
        by, bx = ys // bs, xs // bs
        np.subtract.at(S, (by, bx), b[ys, xs].astype(np.int32) - a[ys, xs])
        np.subtract.at(N, (by, bx), 1)
        tiles[ys // TILE, xs // TILE] = True
    return S, N, tiles


def init_sums(h: int, w: int, c: int, bs: int, dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Zero ``S`` (Hb, Wb, C) of ``dtype`` and ``N`` (Hb, Wb) int64 = pixels per block (edge blocks
    clipped)."""
    hb, wb = -(-h // bs), -(-w // bs)
    rows = np.minimum(bs, h - np.arange(hb) * bs)
    cols = np.minimum(bs, w - np.arange(wb) * bs)
    return np.zeros((hb, wb, c), dtype), (rows[:, None] * cols[None, :]).astype(np.int64)


def crop_box(grid: np.ndarray, block: int, h: int, w: int):
    """(y0, y1, x0, x1): the tiles with any change plus one tile of context, or None."""
    nz = np.nonzero(grid > 0)
    if nz[0].size == 0:
        return None
    y0, y1 = max(int(nz[0].min()) - 1, 0) * block, min((int(nz[0].max()) + 2) * block, h)
    x0, x1 = max(int(nz[1].min()) - 1, 0) * block, min((int(nz[1].max()) + 2) * block, w)
    return y0, y1, x0, x1


def area_tiles(area: np.ndarray, bs: int, ht: int, wt: int) -> np.ndarray:
    """(Ht, Wt) bool: tiles that overlap a flagged level-0 block."""
    f = TILE // bs
    out = _block_sum(area, f) > 0
    return out[:ht, :wt]
