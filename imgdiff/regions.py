"""Regions from the tile grid: per-tile statistics of the changed pixels -> merged components.

Every backend reduces the changed pixels of a pair to :class:`TileStats` on the ``TILE``-pixel
grid (16 px, :data:`imgdiff.core.BLOCK`): per tile the number of changed pixels, the sum and max of
their raw per-pixel deltas (max over channels, integer raw units, so every backend gets the very
same numbers) and their exact inclusive pixel box. Only tiles that can hold a change are ever read
(the max-pooled grid proves the others empty), so no full-size change mask is built.

Regions are connected groups of tiles holding changes. Two such tiles belong to the same region
when a chain of them joins the two in which consecutive tiles are at most ``1 + merge_gap // TILE``
tiles apart along each axis (touching tiles, diagonals included, always merge; a gap of ``n`` empty
tiles is bridged when ``n * TILE <= merge_gap``). Deviation from a pixel-level rule: two changes in
touching tiles merge even when up to ``2 * TILE - 1`` px apart, and the gap is measured in whole
tiles; this is what keeps an all-pixels-differ 4K pair at a 240x135 labelling problem instead of an
8M-pixel one. Each region's bbox is the exact box of its changed pixels (union of its tiles' exact
boxes), so the global bbox is exactly the brute-force box in exact mode.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from imgdiff.morph import components8, dilate
from imgdiff.result import Region

TILE = 16
"""Side of the statistics tiles in pixels (equal to :data:`imgdiff.core.BLOCK`)."""


class TileStats(namedtuple("TileStats", "count total peak box")):
    """Changed-pixel statistics per ``TILE`` tile, arrays of shape (Ht, Wt): ``count`` int64 changed
    pixels; ``total`` int64 sum of their raw deltas; ``peak`` int64 largest raw delta; ``box``
    (Ht, Wt, 4) int64 inclusive pixel box (x0, y0, x1, y1), meaningless where count == 0.

    A named tuple: a frozen dataclass costs ~0.5 ms to create at import, on the CLI's critical path."""

    __slots__ = ()


def empty_stats(h: int, w: int) -> TileStats:
    """All-zero :class:`TileStats` for an ``h x w`` image (boxes preset so min/max updates work)."""
    ht, wt = -(-h // TILE), -(-w // TILE)
    box = np.empty((ht, wt, 4), np.int64)
    box[..., :2] = np.iinfo(np.int64).max
    box[..., 2:] = -1
    return TileStats(
        count=np.zeros((ht, wt), np.int64),
        total=np.zeros((ht, wt), np.int64),
        peak=np.zeros((ht, wt), np.int64),
        box=box,
    )


def tile_stats_from_mask(mask: np.ndarray, delta: np.ndarray, origin: tuple[int, int], h: int, w: int):
    """Vectorised NumPy :class:`TileStats` of a crop: ``mask`` (h', w') bool, ``delta`` (h', w') raw ints.

    ``origin`` = (oy, ox) of the crop in the ``h x w`` image; the crop may start anywhere.
    """
    st = empty_stats(h, w)
    if not mask.any():
        return st
    oy, ox = origin
    ty0, tx0 = oy // TILE, ox // TILE
    py, px = oy - ty0 * TILE, ox - tx0 * TILE
    hh, ww = mask.shape
    nty, ntx = -(-(py + hh) // TILE), -(-(px + ww) // TILE)
    m = np.zeros((nty * TILE, ntx * TILE), bool)
    m[py : py + hh, px : px + ww] = mask
    d = np.zeros(m.shape, np.int64)
    d[py : py + hh, px : px + ww] = delta
    d *= m
    m4 = m.reshape(nty, TILE, ntx, TILE)  # (ty, y, tx, x)
    d4 = d.reshape(nty, TILE, ntx, TILE)
    count = m4.sum(axis=(1, 3))
    sl = (slice(ty0, ty0 + nty), slice(tx0, tx0 + ntx))
    st.count[sl] = count
    st.total[sl] = d4.sum(axis=(1, 3))
    st.peak[sl] = d4.max(axis=(1, 3))
    rows = m4.any(axis=3)  # (ty, y, tx)
    cols = m4.any(axis=1)  # (ty, tx, x)
    base_y = (ty0 + np.arange(nty))[:, None] * TILE  # (nty, 1) first image row of each tile
    base_x = (tx0 + np.arange(ntx))[None, :] * TILE  # (1, ntx)
    x0 = base_x + cols.argmax(axis=2)
    x1 = base_x + TILE - 1 - cols[:, :, ::-1].argmax(axis=2)
    y0 = base_y + rows.argmax(axis=1)
    y1 = base_y + TILE - 1 - rows[:, ::-1, :].argmax(axis=1)
    on = count > 0
    box = st.box[sl]
    for k, v in enumerate((x0, y0, x1, y1)):
        box[..., k] = np.where(on, v, box[..., k])
    return st


def regions_from_tiles(st: TileStats, *, merge_gap: int, scale: int) -> list[Region]:
    """Merge the tiles holding changes into regions (see the module docstring); sorted by (y0, x0, y1, x1).

    ``scale`` converts raw deltas to 0-255 units (1 for 8-bit, 257 for 16-bit pairs).
    """
    if merge_gap < 0:
        raise ValueError(f"merge_gap must be >= 0 pixels, got {merge_gap}")
    on = st.count > 0  # (Ht, Wt)
    if not on.any():
        return []
    ys, xs = np.nonzero(on)
    ty0, ty1, tx0, tx1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    m = on[ty0:ty1, tx0:tx1]
    g = int(merge_gap) // TILE
    work = np.zeros((m.shape[0] + g, m.shape[1] + g), np.uint8)  # room to dilate right/down
    work[: m.shape[0], : m.shape[1]] = m
    if g > 0:
        work = dilate(work, g + 1, anchor=(g, g))  # out[p] = max(in[p-g..p])
    n, labels = components8(work)
    lab = labels[: m.shape[0], : m.shape[1]][m]  # (K,) labels of the tiles with changes
    sl = (slice(ty0, ty1), slice(tx0, tx1))
    cnt, tot, pk, bx = st.count[sl][m], st.total[sl][m], st.peak[sl][m], st.box[sl][m]  # (K,), (K, 4)
    counts = np.bincount(lab, weights=cnt, minlength=n).astype(np.int64)
    totals = np.zeros(n, np.int64)
    np.add.at(totals, lab, tot)
    peaks = np.zeros(n, np.int64)
    np.maximum.at(peaks, lab, pk)
    lo = np.full((n, 2), np.iinfo(np.int64).max, np.int64)
    hi = np.full((n, 2), -1, np.int64)
    np.minimum.at(lo, lab, bx[:, :2])
    np.maximum.at(hi, lab, bx[:, 2:])
    out = [
        Region(
            bbox=(int(lo[k, 0]), int(lo[k, 1]), int(hi[k, 0]), int(hi[k, 1])),
            pixels=int(counts[k]),
            max_delta=float(peaks[k]) / scale,
            mean_delta=float(totals[k]) / scale / float(counts[k]),
        )
        for k in range(1, n)
        if counts[k] > 0
    ]
    out.sort(key=lambda r: (r.bbox[1], r.bbox[0], r.bbox[3], r.bbox[2]))
    return out
