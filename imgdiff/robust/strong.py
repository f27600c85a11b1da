"""Strong changes: the both-sides 3x3 range test and the 3x3 opening of ``max_c |d| > margin``, on
tiles that can hold one (see :mod:`imgdiff.robust`)."""

from __future__ import annotations

import numpy as np

from imgdiff import morph
from imgdiff.core import pixel_delta
from imgdiff.regions import TILE
from imgdiff.robust.blocks import _block_sum
from imgdiff.robust.params import RobustParams


def margin_raw(params: RobustParams, scale: int) -> float:
    """The strong-change margin in raw units."""
    return float(params.margin) * scale


def strong_mask(a: np.ndarray, b: np.ndarray, box: tuple[int, int, int, int], *, window: int, margin: float):
    """(y1-y0, x1-x0) bool strong pixels of ``box`` = (y0, y1, x0, x1); ``margin`` in raw units.

    Both-sides range test with the ``window`` neighbourhood clipped to the image (OpenCV's
    default morphology border ignores outside pixels).
    """
    y0, y1, x0, x1 = box
    h, w, _ = a.shape
    r = window // 2
    ey0, ey1, ex0, ex1 = max(y0 - r, 0), min(y1 + r, h), max(x0 - r, 0), min(x1 + r, w)
    A, B = a[ey0:ey1, ex0:ex1], b[ey0:ey1, ex0:ex1]  # (h'', w'', C)
    inner = (slice(y0 - ey0, y1 - ey0), slice(x0 - ex0, x1 - ex0))
    Ai, Bi = A[inner].astype(np.int32), B[inner].astype(np.int32)  # (h', w', C)
    if not (np.abs(Bi - Ai).max(initial=0) > margin):
        return np.zeros((y1 - y0, x1 - x0), bool)
    out = np.zeros((y1 - y0, x1 - x0), bool)
    for ref, other in ((A, Bi), (B, Ai)):
        hi = morph.dilate(ref, window)[inner].astype(np.int32)
        lo = morph.erode(ref, window)[inner].astype(np.int32)
        out |= ((other - hi > margin) | (lo - other > margin)).any(axis=2)
    # Coherent strong blocks: the 3x3 opening of ``max_c |d| > margin`` (needs 2 px of context).
    fy0, fy1, fx0, fx1 = max(y0 - 2, 0), min(y1 + 2, h), max(x0 - 2, 0), min(x1 + 2, w)
    big = (pixel_delta(a[fy0:fy1, fx0:fx1], b[fy0:fy1, fx0:fx1]) > margin).view(np.uint8)  # (h2, w2)
    if big.any():
        opened = morph.open3(big)
        out |= opened[y0 - fy0 : y1 - fy0, x0 - fx0 : x1 - fx0].astype(bool)
    return out


def _strong_boxes(a, b, crop, margin: float, ad=None, grid=None) -> list[tuple[int, int, int, int]]:
    """Boxes (y0, y1, x0, x1) that hold every strong pixel of the crop: its tiles where
    ``max_c |d| > margin`` somewhere (a strong pixel needs that), or their bounding box when many or
    clustered (it fills <= 4x their area): a pixel outside them is never strong, so the mask is the same."""
    y0, y1, x0, x1 = crop
    if grid is not None:  # (th, tw) tiles of the crop (crop starts on a tile edge)
        cand = grid[y0 // TILE : -(-y1 // TILE), x0 // TILE : -(-x1 // TILE)] > margin
    else:
        if ad is None:
            ad = pixel_delta(a[y0:y1, x0:x1], b[y0:y1, x0:x1])
        cand = _block_sum(ad > margin, TILE) > 0
    ty, tx = np.nonzero(cand)
    span = (int(ty.max()) - int(ty.min()) + 1) * (int(tx.max()) - int(tx.min()) + 1) if ty.size else 0
    if ty.size > 64 or 0 < span <= 4 * ty.size:  # many, or clustered: one pass over their bounding box
        ty, tx, ty1, tx1 = [ty.min()], [tx.min()], [ty.max() + 1], [tx.max() + 1]
    else:
        ty1, tx1 = ty + 1, tx + 1
    return [
        (y0 + int(i0) * TILE, min(y0 + int(i1) * TILE, y1), x0 + int(j0) * TILE, min(x0 + int(j1) * TILE, x1))
        for i0, j0, i1, j1 in zip(ty, tx, ty1, tx1)
    ]


def strong_in_crop(
    a: np.ndarray, b: np.ndarray, crop, *, window: int, margin: float, ad=None, grid=None
) -> np.ndarray:
    """(h', w') bool strong pixels of the crop (y0, y1, x0, x1), testing only tiles where
    ``max_c |d| > margin`` somewhere (a strong pixel needs that). ``ad``: the crop's raw max-channel
    ``|d|`` when already computed; ``grid``: the image's (Ht, Wt) max-pooled raw ``|d|`` per tile
    (``core.block_max_numpy(a, b, TILE)``), which answers the same question without reading pixels."""
    y0, y1, x0, x1 = crop
    out = np.zeros((y1 - y0, x1 - x0), bool)
    for by0, by1, bx0, bx1 in _strong_boxes(a, b, crop, margin, ad, grid):
        m = strong_mask(a, b, (by0, by1, bx0, bx1), window=window, margin=margin)
        out[by0 - y0 : by1 - y0, bx0 - x0 : bx1 - x0] = m
    return out


def strong_points(a: np.ndarray, b: np.ndarray, crop, *, window: int, margin: float, grid=None):
    """``(ys, xs)`` image coordinates of the crop's strong pixels (same pixels as :func:`strong_in_crop`,
    in no particular order), without a crop-sized mask (a strong pixel is rare, and ``np.nonzero`` of a
    4K mask costs ~L). Scattered tiles over ``margin`` (JPEG q90 noise: a few dozen) have their candidate
    pixels tested together (:func:`_strong_pixels`); one box (clustered tiles) with :func:`strong_mask`."""
    boxes = _strong_boxes(a, b, crop, margin, None, grid)
    if len(boxes) > 1:  # single tiles (at most 64, else _strong_boxes merges them)
        return _strong_pixels(a, b, np.array(boxes).reshape(-1, 4), window=window, margin=margin)
    ys, xs = [np.zeros(0, np.intp)], [np.zeros(0, np.intp)]
    for by0, by1, bx0, bx1 in boxes:
        yy, xx = np.nonzero(strong_mask(a, b, (by0, by1, bx0, bx1), window=window, margin=margin))
        ys.append(yy + by0)
        xs.append(xx + bx0)
    return np.concatenate(ys), np.concatenate(xs)


def _chmax(x: np.ndarray) -> np.ndarray:
    """Max over the last (channel) axis by elementwise maxima: a reduction over a short axis is slow."""
    out = x[..., 0].copy()
    for k in range(1, x.shape[-1]):
        np.maximum(out, x[..., k], out=out)
    return out


def _absmax(a: np.ndarray, b: np.ndarray, ys, xs) -> np.ndarray:
    """Raw ``max_c |b - a|`` (int32) at the gathered pixels ``(ys, xs)`` (any broadcastable shapes)."""
    return _chmax(np.abs(b[ys, xs].astype(np.int32) - a[ys, xs]))


def _strong_pixels(a, b, boxes: np.ndarray, *, window: int, margin: float):
    """``(ys, xs)``: the strong pixels of ``boxes`` (K, 4) = (y0, y1, x0, x1), each at most a tile.

    The rule of :func:`strong_mask`, for all candidate pixels (``max_c |d| > margin``, which a strong pixel
    needs) at once, on neighbourhoods gathered with clipped indices: for a min or max that equals
    clipping the window. The 3x3 opening reads the 5x5 ``|d| > margin`` flags around each pixel: a
    window centred on an image pixel is full when its pixels inside the image all pass (numba's
    ``_in_strong_block``). Reductions over the short window axes are written as elementwise ops.
    One vectorised pass instead of a ``strong_mask`` per tile (~0.07 ms each)."""
    h, w, _ = a.shape
    off = np.arange(TILE)
    ys, xs = boxes[:, 0, None] + off, boxes[:, 2, None] + off  # (K, T)
    inside = (ys < boxes[:, 1, None])[:, :, None] & (xs < boxes[:, 3, None])[:, None, :]  # (K, T, T)
    ys = np.broadcast_to(ys[:, :, None], inside.shape)[inside]  # (P,) the boxes' pixels
    xs = np.broadcast_to(xs[:, None, :], inside.shape)[inside]
    big = _absmax(a, b, ys, xs) > margin
    ys, xs = ys[big], xs[big]  # (P',) candidates
    r = window // 2
    o = np.arange(-r, r + 1)
    ny = np.clip(ys[:, None] + o, 0, h - 1)[:, :, None]  # (P', win, 1)
    nx = np.clip(xs[:, None] + o, 0, w - 1)[:, None, :]  # (P', 1, win)
    pa, pb = a[ys, xs].astype(np.int32), b[ys, xs].astype(np.int32)  # (P', C)
    strong = np.zeros(ys.size, bool)
    for ref, other in ((a, pb), (b, pa)):
        nb = ref[ny, nx].reshape(ys.size, window * window, -1)  # (P', win*win, C)
        hi, lo = nb[:, 0].copy(), nb[:, 0].copy()  # (P', C) the window's range
        for t in range(1, window * window):
            np.maximum(hi, nb[:, t], out=hi)
            np.minimum(lo, nb[:, t], out=lo)
        strong |= _chmax(np.maximum(other - hi, lo - other)) > margin  # how far outside the range
    o = np.arange(-2, 3)
    qy, qx = ys[:, None] + o, xs[:, None] + o  # (P', 5)
    vy, vx = (qy >= 0) & (qy < h), (qx >= 0) & (qx < w)
    flags = _absmax(a, b, np.clip(qy, 0, h - 1)[:, :, None], np.clip(qx, 0, w - 1)[:, None, :])
    ok = (flags > margin) | ~(vy[:, :, None] & vx[:, None, :])  # (P', 5, 5) outside the image: no veto
    run = ok[:, :, 0:3] & ok[:, :, 1:4] & ok[:, :, 2:5]  # (P', 5, 3) 3-wide runs, centre columns 1..3
    full = run[:, 0:3] & run[:, 1:4] & run[:, 2:5]  # (P', 3, 3) full windows, centres p + (-1..1, -1..1)
    full &= vy[:, 1:4, None] & vx[:, None, 1:4]  # centred on the image only
    full = full.reshape(ys.size, 9)
    for t in range(9):
        strong |= full[:, t]
    return ys[strong], xs[strong]
