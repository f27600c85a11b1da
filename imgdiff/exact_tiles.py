"""Exact-mode per-tile statistics with NumPy/OpenCV, without a full-size mask (``backend="numpy"``).

Same numbers as :func:`imgdiff.regions.tile_stats_from_mask` on the brute-force mask (and as
:func:`imgdiff.kernels_cpu.exact_stats_numba`): per ``TILE`` tile the count of pixels whose
channel-max delta exceeds ``thr``, the sum and max of those deltas, and their exact inclusive box.

The image is processed in chunks of up to :data:`CHUNK` tile rows, and only tile rows holding a row
whose bytes differ (compared 8 bytes at a time by :func:`imgdiff.core.changed_rows`) are read again,
so identical and small-change pairs cost about one read of both images. Per chunk:
``cv2.absdiff`` on the interleaved rows, channel max by ``cv2.split`` + ``cv2.max`` (contiguous
planes; a reduction over a length-3 axis is slow in NumPy), ignored pixels zeroed, then tile
reductions by reshapes: sums over the 16 rows of a tile first (contiguous, vectorised, in uint16 /
uint32), then over the 16 columns of the much smaller per-column vectors. The box comes from per-tile
column any-flags (a column count > 0) and per-tile row any-flags (a tile row of 16 one-byte flags is
two ``uint64`` words, OR-ed), never from per-pixel min/max updates.
"""

from __future__ import annotations

import cv2
import numpy as np

from imgdiff.core import changed_rows
from imgdiff.regions import TILE, TileStats, empty_stats

CHUNK = 8
"""Tile rows (of ``TILE`` image rows) handled per vectorised step; bounds the temporaries' size."""


def _channel_max(d: np.ndarray, w: int, c: int) -> np.ndarray:
    """(n, W*C) interleaved deltas -> (n, W) max over channels, contiguous."""
    if c == 1:
        return d
    planes = cv2.split(d.reshape(d.shape[0], w, c))  # C contiguous (n, W) planes
    out = cv2.max(planes[0], planes[1])
    for p in planes[2:]:
        cv2.max(out, p, dst=out)
    return out


def _runs(on: np.ndarray) -> list[tuple[int, int]]:
    """Half-open index ranges of the True entries of a 1-D bool array, each at most CHUNK long."""
    out = []
    idx = np.flatnonzero(np.diff(np.concatenate([[0], on.view(np.int8), [0]])))
    for s, e in zip(idx[::2], idx[1::2], strict=True):
        out += [(int(k), int(min(k + CHUNK, e))) for k in range(s, e, CHUNK)]
    return out


def exact_stats_numpy(a: np.ndarray, b: np.ndarray, *, thr: int, boxes: np.ndarray) -> TileStats:
    """Exact-mode :class:`TileStats` of a normalised pair (H, W, C).

    ``thr``: raw threshold (a delta ``> thr`` is a change); ``boxes``: (K, 4) int inclusive ignore
    boxes (x0, y0, x1, y1), already clipped to the image.
    """
    h, w, c = a.shape
    st = empty_stats(h, w)
    if thr >= np.iinfo(a.dtype).max:
        return st
    wt = st.count.shape[1]
    wp = wt * TILE
    rows = changed_rows(a, b)  # (H,)
    bands = np.add.reduceat(rows, np.arange(0, h, TILE)) > 0  # (Ht,)
    a2, b2 = a.reshape(h, w * c), b.reshape(h, w * c)
    for ty0, ty1 in _runs(bands):
        nt = ty1 - ty0
        y0, y1 = ty0 * TILE, min(h, ty1 * TILE)
        pd = _channel_max(cv2.absdiff(a2[y0:y1], b2[y0:y1]), w, c)  # (n, W)
        if pd.shape != (nt * TILE, wp) or boxes.shape[0]:
            buf = np.zeros((nt * TILE, wp), a.dtype)  # padded to whole tiles with zeros
            buf[: y1 - y0, :w] = pd
            pd = buf
        for bx0, by0, bx1, by1 in boxes:
            if by1 >= y0 and by0 < y1:
                pd[max(by0 - y0, 0) : by1 + 1 - y0, bx0 : bx1 + 1] = 0
        on = pd > thr  # (n, Wp) bool, chunk-sized
        dm = pd * on.view(np.uint8)  # (n, Wp) delta of changed pixels, else 0
        on3 = on.view(np.uint8).reshape(nt, TILE, wp)
        colcnt = on3.sum(axis=1, dtype=np.uint16)  # (nt, Wp) changed pixels per tile column
        count = colcnt.reshape(nt, wt, TILE).sum(axis=2, dtype=np.int64)  # (nt, Wt)
        if not count.any():
            continue
        dsum = dm.reshape(nt, TILE, wp).sum(axis=1, dtype=np.uint32)  # (nt, Wp)
        total = dsum.reshape(nt, wt, TILE).sum(axis=2, dtype=np.int64)
        peak = dm.reshape(nt, TILE, wp).max(axis=1).reshape(nt, wt, TILE).max(axis=2)
        cols = colcnt.reshape(nt, wt, TILE) > 0  # (nt, Wt, 16)
        words = on.view(np.uint64).reshape(nt, TILE, wt, TILE // 8)  # 16 flags = 2 words
        tile_rows = (words[..., 0] | words[..., 1]) != 0  # (nt, 16, Wt)
        sel = count > 0
        base_x = (np.arange(wt) * TILE)[None, :]  # (1, Wt)
        base_y = ((ty0 + np.arange(nt)) * TILE)[:, None]  # (nt, 1)
        x0 = base_x + cols.argmax(axis=2)
        x1 = base_x + TILE - 1 - cols[:, :, ::-1].argmax(axis=2)
        yy0 = base_y + tile_rows.argmax(axis=1)
        yy1 = base_y + TILE - 1 - tile_rows[:, ::-1, :].argmax(axis=1)
        sl = slice(ty0, ty1)
        st.count[sl] = count
        st.total[sl] = total
        st.peak[sl] = peak
        box = st.box[sl]
        for k, v in enumerate((x0, yy0, x1, yy1)):
            box[..., k] = np.where(sel, v, box[..., k])
    return st
