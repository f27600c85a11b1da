"""Noise- and gradient-aware change detection (the default ``mode="robust"``), pure NumPy/OpenCV.

Goal (issue 2, item 4): find smooth low-amplitude changes (a +8 brightness bump, a 0->12 ramp)
while ignoring JPEG re-encoding noise and sub-pixel shifts of anti-aliased edges and text, and
never dropping an isolated strong change. Everything is in 0-255 units (16-bit is divided by 257);
``d = B - A`` is the *signed* per-channel delta and ``A`` is the reference.

The rule. A pixel is reported as changed when (1) OR (2) holds:

1. **Strong change** (pixelmatch-style both-sides neighbourhood test, after Mapbox pixelmatch's
   anti-aliasing check, simplified): in some channel, ``B[p]`` lies outside
   ``[min, max]`` of ``A``'s 3x3 neighbourhood of ``p`` by more than ``margin``, or ``A[p]`` lies
   outside the 3x3 range of ``B`` around ``p`` by more than ``margin`` (catches removals). A
   sub-pixel shift or a resampling only interpolates between neighbours, so it stays inside the
   range; JPEG ringing overshoots it by less than ``margin``. A new or removed pixel/line with
   contrast above ``margin`` is always found, even alone. Deviation from pixelmatch: no
   "has many equal siblings" heuristic, so a real one-pixel change is never explained away as
   anti-aliasing. Second deviation: on a high-texture reference the 3x3 range spans nearly
   0..255 and explains almost any value, so a pixel is also strong when it lies in a 3x3 window
   whose nine pixels all have ``max_c |d| > margin`` (the 3x3 morphological opening of that mask,
   windows clipped to the image): a sub-pixel shift changes thin bands along edges (at most ~2 px
   wide), never a solid 3x3 block, so a coherent block of strong changes is not explained away.
2. **Coherent weak change**: ``p`` lies in a *flagged block* and ``max_c |d[p]| > threshold``.
   Blocks form a pyramid of sides ``block * 2**l`` (``l < levels``). A block is flagged when, in
   some channel, the sum ``S`` of signed deltas of its non-strong pixels satisfies
   ``|S| > z * sqrt(V)`` and ``|S| > min_mean * n``, with ``n`` its non-strong pixel count and
   ``V = sum_p sigma_p**2`` over its non-strong pixels, ``sigma_p = sigma0 + texture_gain * R[p]`` the
   per-pixel noise allowance. ``R`` is constant on each level-0 block: with ``G[b]`` the largest 3x3
   range (max - min, per channel, windows clipped to the image) of the reference ``A`` over the pixels
   of block ``b``, ``R[p]`` is the largest ``G`` over the blocks within ``k = ceil(spread / block)``
   blocks of ``p``'s block (the (2k+1)^2 block neighbourhood, clipped to the grid). It grows with the
   reference's local gradient/texture and is 0 in flat areas, so ``sigma_p = sigma0`` there; the
   neighbourhood accounts for JPEG spreading an edge's error over its 8x8 / 16x16 blocks. So a
   block's ``V = n*sigma0**2 + 2*sigma0*g*sum R + g**2*sum R**2`` (``g = texture_gain``) with
   ``sum R = sum over its level-0 blocks of n_b * R_b`` (``n_b`` their weak pixels).
   Zero-mean noise grows like ``sigma*sqrt(n)`` while a coherent change grows like ``n``, so
   the test is the usual ``mean > z * sigma / sqrt(n)``. Level ``l+1`` sums its four children
   *minus* children already flagged (and their ``n`` and ``V``), so a big block is flagged only by
   weak change that smaller blocks could not explain; a strong local change does not smear into
   its large parent block.

Regions/bbox in robust mode are therefore: strong pixels, plus the pixels of the union of all
flagged blocks (each at its own level's size) whose max-channel ``|d|`` exceeds ``threshold``
(default 2 levels). Ignored boxes are removed afterwards (they still take part in block sums).

Parameters (:class:`RobustParams`): ``margin`` 32 levels, ``sigma0`` 1.0, ``texture_gain`` 0.2,
``spread`` 8 px, ``window`` 3 (strong-test neighbourhood), ``z`` 6, ``min_mean`` 1.5 levels,
``block`` 8 px, ``levels`` 5 (8..128 px). Margins below ~30 let JPEG q90 chroma ringing at strong
colour edges through as strong changes; a one-pixel change must exceed the 3x3 range by ``margin``.
They were chosen on the golden cases in ``tests/imgdiff/test_robust_golden.py`` (`tests/imgdiff/cases.py`).

How it is computed (only the work the answer needs; all sums are exact integers in raw units, so
every backend gets bit-identical flags):

- Pass 1 (per backend, over the crop of tiles the max-pooled grid says can differ, plus one tile):
  per level-0 block and channel the signed sum ``S`` of the weak pixels' deltas and the count
  ``N`` of weak pixels. The 3x3 range test runs only where ``max_c |d| > margin`` (a strong pixel
  needs that), which on JPEG noise is almost nowhere.
- The pyramid (:func:`flag_area`) runs on the (Hb, Wb) block sums, level by level, and tests
  ``|S| > min_mean * n`` first; only blocks that pass it (on JPEG q90 noise about 2% of level-0
  blocks and a handful above) need ``V``. ``V`` computed with each block's own ``G`` instead of
  ``R`` (``G <= R``) is a lower bound, so a block that fails the test with it fails it exactly; only
  the others read ``G`` of the ``k`` blocks around (:func:`block_texture`: the blocks are gathered
  with a 1-px border and reduced with vectorised 1-D shifts; results are memoised across levels).
  Everything past the ``min_mean`` test works on gathered candidates, never on whole-grid arrays;
  sums are int32 where exact (:func:`sum_dtype`).
  Strong pixels are found only in tiles whose max-pooled ``|d|`` exceeds ``margin`` (scattered
  tiles: all their candidate pixels in one gathered pass, :func:`_strong_pixels`) and are taken
  out of the block sums one by one.
- The changed pixels are then read only in tiles that hold a flagged block or a strong pixel.

Neighbourhoods (3x3 range, ``spread``) are clipped to the image. Deviations from the first version:
blocks are aligned to the image (not to the crop) and sums are integers (not float32); ``R`` was
the per-pixel max 3x3 range within ``spread`` px of ``p`` (a 17x17 window at the defaults) and is
now the per-block rule above (a block-aligned 24x24 window at the defaults, which contains the old
one, so the allowance can only grow): it needs no full-image morphology, only per-block aggregates
of the candidate blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from numpy.lib.stride_tricks import as_strided

from imgdiff import morph
from imgdiff.core import in_row_halves, pixel_delta
from imgdiff.regions import TILE


@dataclass(frozen=True)
class RobustParams:
    """Knobs of the robust rule (see the module docstring)."""

    margin: float = 32.0
    """Levels beyond the other image's 3x3 [min, max] range that make a pixel a strong change."""
    sigma0: float = 1.0
    """Per-pixel noise allowance in flat areas (levels)."""
    texture_gain: float = 0.2
    """Extra noise allowance per level of the reference's local 3x3 range (gradient/texture)."""
    z: float = 6.0
    """Significance of a block's signed sum against its noise allowance (in standard deviations)."""
    min_mean: float = 1.5
    """Smallest mean signed delta (levels) of a flagged block, whatever its size."""
    spread: int = 8
    """The noise allowance at p uses the largest 3x3 range within ceil(spread / block) blocks of p's
    block (JPEG spreads edge errors over its 8x8 / 16x16 blocks)."""
    window: int = 3
    """Side of the neighbourhood of the strong-change range test (odd, >= 3)."""
    block: int = 8
    """Side of the smallest pyramid block in pixels (a power of two <= 16)."""
    levels: int = 5
    """Number of pyramid levels; block sides are block * 2**l."""

    def __post_init__(self) -> None:
        if self.block not in (1, 2, 4, 8, 16):
            raise ValueError(f"robust block must be a power of two <= 16, got {self.block}")
        if self.window < 3 or self.window % 2 == 0:
            raise ValueError(f"robust window must be odd and >= 3, got {self.window}")
        if self.spread < 0:
            raise ValueError(f"robust spread must be >= 0 px, got {self.spread}")
        if self.levels < 1:
            raise ValueError(f"robust levels must be >= 1, got {self.levels}")
        for f in ("margin", "sigma0", "texture_gain", "z", "min_mean"):
            if getattr(self, f) < 0:
                raise ValueError(f"robust {f} must be >= 0, got {getattr(self, f)}")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _acc_dtype(dtype: np.dtype, s: int):
    """Narrowest accumulator that holds a sum of ``s*s`` values of ``dtype`` (signed: int64)."""
    if dtype == np.bool_:
        return np.uint16
    if dtype.kind == "u":
        bound = int(np.iinfo(dtype).max) * s * s
        for acc in (np.uint16, np.uint32):
            if bound <= np.iinfo(acc).max:
                return acc
        return np.uint64  # uint64 input: squared 16-bit ranges, far below 2**64 per block
    return np.int64


def _block_sum(x: np.ndarray, s: int) -> np.ndarray:
    """Sum ``s x s`` blocks over the first two axes (zero-padded at the far edges), int64.

    ``s`` strided elementwise adds per axis in the narrowest exact accumulator (uint16 for 8-bit
    input and ``s <= 16``): SIMD adds, about 3x faster than a widening ``sum`` over a reshaped axis."""
    h, w = x.shape[:2]
    ph, pw = -(-h // s) * s, -(-w // s) * s
    if (ph, pw) != (h, w):
        pad = [(0, ph - h), (0, pw - w)] + [(0, 0)] * (x.ndim - 2)
        x = np.pad(x, pad)
    rows = x[0::s].astype(_acc_dtype(x.dtype, s))  # (hb, pw, ...)
    for k in range(1, s):
        rows += x[k::s]
    cols = rows.reshape(ph // s, pw // s, s, *x.shape[2:])  # (hb, wb, s, ...)
    out = cols[:, :, 0].copy()
    for k in range(1, s):
        out += cols[:, :, k]
    return out.astype(np.int64)


def _block_sum_diff(b: np.ndarray, a: np.ndarray, s: int) -> np.ndarray:
    """``_block_sum(b, s) - _block_sum(a, s)``: int32 for 8-bit input (in one column pass), else int64.

    Both row passes run in uint16 (exact: at most ``s * 255``); their difference, taken modulo 2**16,
    is the exact signed row sum as int16 (``|.| <= 16 * 255``), so a single column pass over that
    difference replaces two (and their int64 casts). The column pass runs on the transpose, where a
    block's ``s`` columns are rows: halving adds over long contiguous rows (int16 while the partial sums
    of ``s/2`` row sums fit, ``<= 16/2 * 16 * 255``, the last add in int32), ~2.7x faster than ``s``
    strided adds of ``(hb, wb, C)`` slices."""
    if a.dtype != np.uint8 or s > 16 or a.shape[:2] != b.shape[:2] or (a.shape[0] % s or a.shape[1] % s):
        return _block_sum(b, s) - _block_sum(a, s)
    rb, ra = b[0::s].astype(np.uint16), a[0::s].astype(np.uint16)  # (hb, W, ...)
    for k in range(1, s):
        rb += b[k::s]
        ra += a[k::s]
    rb -= ra  # modulo 2**16: the int16 bit pattern of the exact signed difference
    hb, wb, c = a.shape[0] // s, a.shape[1] // s, rb[0, 0].size
    t = morph.transpose(rb.view(np.int16).reshape(hb, wb * s * c)).reshape(wb, s, c * hb)  # (wb, s, C*hb)
    while t.shape[1] > 2:
        t = t[:, : t.shape[1] // 2] + t[:, t.shape[1] // 2 :]
    out = t[:, 0].astype(np.int32)  # (wb, C*hb)
    if t.shape[1] == 2:
        out += t[:, 1]
    return out.reshape(wb, c, hb).transpose(2, 0, 1).reshape(hb, wb, *a.shape[2:])  # (hb, wb, ...)


def _pool2(x: np.ndarray) -> np.ndarray:
    """Sum 2x2 neighbours over the first two axes (even sizes).

    Row pairs first (long contiguous rows), then column pairs as the two halves of each pair's
    ``2 * C`` elements: elementwise adds, ~1.6x faster than four strided 2-D slices and than a reduce."""
    rows = x[0::2] + x[1::2]  # (h/2, w, ...)
    pairs = rows.reshape(rows.shape[0], rows.shape[1] // 2, -1)  # (h/2, w/2, 2 * C)
    half = pairs.shape[2] // 2
    return (pairs[:, :, :half] + pairs[:, :, half:]).reshape(rows.shape[0], rows.shape[1] // 2, *x.shape[2:])


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


def block_texture(a: np.ndarray, blocks: np.ndarray, bs: int) -> np.ndarray:
    """(K, C) int64: ``G`` = the largest 3x3 range (max - min, clipped to the image) of ``a`` over the
    pixels of each level-0 block ``blocks`` (K, 2) = (row, col) on the ``bs``-px block grid.

    The blocks are gathered with a 1-px border as (K, bs+2, (bs+2)*C) rows (a strided view for inner
    blocks; for blocks on the image border the indices are clipped, which for a max or min equals
    clipping the window, and positions past the far edge only see a subset of an edge pixel's window),
    and the 3-tap max/min run as long 1-D shifts over the gathered buffer (shift C along x, one patch
    row along y); window starts that straddle two patches are computed but never read. Block maxima
    by halving (bs is a power of two): short-axis reductions are slow in NumPy.
    """
    a = np.ascontiguousarray(a)
    h, w, c = a.shape
    hb, wb = -(-h // bs), -(-w // bs)
    K, L = len(blocks), (bs + 2) * c
    buf = np.empty((K, bs + 2, L), a.dtype)  # (K, bs+2, (bs+2)*C) each block with its 1-px border
    inner = (blocks[:, 0] >= 1) & (blocks[:, 0] <= hb - 2) & (blocks[:, 1] >= 1) & (blocks[:, 1] <= wb - 2)
    if inner.any():  # a strided view of the image itself: patch (i, j) starts at pixel (i*bs-1, j*bs-1)
        s0, s1, s2 = a.strides
        view = as_strided(a[bs - 1 :, bs - 1 :], (hb - 2, wb - 2, bs + 2, L), (bs * s0, bs * s1, s0, s2))
        buf[inner] = view[blocks[inner, 0] - 1, blocks[inner, 1] - 1]
    if not inner.all():  # border blocks: indices clipped to the image (= a clipped window)
        edge = blocks[~inner]
        off = np.arange(-1, bs + 1)
        rows = np.clip(edge[:, 0, None] * bs + off, 0, h - 1)  # (Ke, bs+2)
        cols = np.clip(edge[:, 1, None] * bs + off, 0, w - 1)
        buf[~inner] = a[rows[:, :, None], cols[:, None, :]].reshape(len(edge), bs + 2, L)
    flat = buf.reshape(-1)
    m = flat.size
    x3 = (flat[: m - 2 * c], flat[c : m - c], flat[2 * c :])
    hx, lx = np.maximum(np.maximum(x3[0], x3[1]), x3[2]), np.minimum(np.minimum(x3[0], x3[1]), x3[2])
    n = hx.size
    hy = np.maximum(np.maximum(hx[: n - 2 * L], hx[L : n - L]), hx[2 * L :])
    hy -= np.minimum(np.minimum(lx[: n - 2 * L], lx[L : n - L]), lx[2 * L :])
    rng = np.zeros(K * (bs + 2) * L, hy.dtype)
    rng[: hy.size] = hy
    v = rng.reshape(K, bs + 2, L)[:, :bs, : bs * c]  # (K, bs, bs*C) ranges of the block's pixels
    while v.shape[1] > 1:
        v = np.maximum(v[:, : v.shape[1] // 2], v[:, v.shape[1] // 2 :])
    v = v[:, 0]  # (K, bs*C)
    while v.shape[1] > c:
        v = np.maximum(v[:, : v.shape[1] // 2], v[:, v.shape[1] // 2 :])
    return v.astype(np.int64)  # (K, C)


class _Texture:
    """Per-block texture, computed lazily and memoised: ``G`` (a block's own max 3x3 range) and ``Rb``
    (the max of ``G`` over the blocks within ``k`` blocks), both (ph, pw, C) on the padded grid and
    valid only where asked for."""

    def __init__(self, a: np.ndarray, bs: int, k: int, shape: tuple[int, int]):
        self.a, self.bs, self.k = a, bs, k
        self.hb, self.wb = -(-a.shape[0] // bs), -(-a.shape[1] // bs)
        self.G = np.zeros((*shape, a.shape[2]), np.int64)  # valid where ``have`` (0 on padding)
        self.have = np.zeros(shape, bool)
        self.Rb = np.zeros((*shape, a.shape[2]), np.int64)  # valid where ``done``
        self.done = np.zeros(shape, bool)

    def own(self, need: np.ndarray) -> np.ndarray:
        """Make ``G`` valid on the (ph, pw) bool ``need``; returns ``G`` (ph, pw, C)."""
        todo = need & ~self.have
        todo[self.hb :] = todo[:, self.wb :] = False  # padding: G = 0
        if todo.any():
            idx = _argwhere2(todo)  # (K, 2)
            self.G[idx[:, 0], idx[:, 1]] = block_texture(self.a, idx, self.bs)
        self.have |= need
        return self.G

    def require(self, need: np.ndarray) -> np.ndarray:
        """Make ``Rb`` valid on the (ph, pw) bool ``need``; returns ``Rb`` (ph, pw, C).

        Few blocks (the usual case: on JPEG q90 noise a few dozen): their (2k+1)^2 neighbourhoods are
        gathered (indices clipped to the grid, which for a max equals clipping the neighbourhood) and
        reduced; many: one dilation of the whole grid (:func:`_dilate_grid`). Same numbers."""
        need = need & ~self.done
        need[self.hb :] = need[:, self.wb :] = False  # padding: Rb = 0 (never read: N = 0 there)
        if not need.any():
            return self.Rb
        k, hb, wb = self.k, self.hb, self.wb
        idx = _argwhere2(need)  # (K, 2)
        if not k:
            self.Rb[idx[:, 0], idx[:, 1]] = self.own(need)[idx[:, 0], idx[:, 1]]
        elif len(idx) * (2 * k + 1) ** 2 <= GATHER_BLOCKS * hb * wb:
            off = np.arange(-k, k + 1)
            rows = np.clip(idx[:, 0, None] + off, 0, hb - 1)  # (K, 2k+1)
            cols = np.clip(idx[:, 1, None] + off, 0, wb - 1)
            near = np.zeros_like(need)
            near[rows[:, :, None], cols[:, None, :]] = True
            G = self.own(near)[rows[:, :, None], cols[:, None, :]]  # (K, 2k+1, 2k+1, C)
            self.Rb[idx[:, 0], idx[:, 1]] = G.max(axis=(1, 2))
        else:
            near = morph.dilate(need.view(np.uint8), 2 * k + 1).astype(bool)
            Rb = _dilate_grid(self.own(near)[:hb, :wb], k)  # (hb, wb, C), exact where ``need``
            self.Rb[idx[:, 0], idx[:, 1]] = Rb[idx[:, 0], idx[:, 1]]
        self.done |= need
        return self.Rb


def _argwhere2(mask: np.ndarray) -> np.ndarray:
    """``np.argwhere`` of a 2-D bool array (K, 2), from the flat indices: a 1-D ``nonzero`` is ~5x
    faster than a 2-D one (0.05 vs 0.24 ms on a 4K image's block grid)."""
    flat = np.flatnonzero(mask)
    return np.stack(np.divmod(flat, mask.shape[1]), axis=1)


GATHER_BLOCKS = 1.0
""":meth:`_Texture.require` gathers each needed block's neighbourhood while that reads at most this many
blocks per block of the grid (else it dilates the whole grid). A module constant so tests can force
either path."""


def _dilate_grid(G: np.ndarray, k: int) -> np.ndarray:
    """(hb, wb, C) int64: max of ``G`` over the (2k+1)^2 neighbouring blocks (clipped to the grid)."""
    small = G.astype(np.uint16)  # ranges of 8/16-bit data fit
    return morph.dilate(small, 2 * k + 1).astype(np.int64)


def _cells(i: np.ndarray, j: np.ndarray, shape: tuple[int, int], side: int) -> np.ndarray:
    """(ph, pw) bool: the level-0 blocks under the level cells ``(i, j)`` of a grid of ``shape``."""
    cells = np.zeros((shape[0] * side, shape[1] * side), bool)
    off = np.arange(side)
    cells[(i[:, None] * side + off)[:, :, None], (j[:, None] * side + off)[:, None, :]] = True
    return cells


def _var(tab, need, i, j, k, side: int, N0, N, s0: float, g: float) -> np.ndarray:
    """(K,) ``V`` (levels**2) of the level cells ``(i, j)``, channel ``k``, with the per-block texture
    ``tab`` (ph, pw, C): ``sum R = sum of N0 * tab`` over the weak level-0 blocks (``need``).

    Only the cells' own level-0 blocks are gathered, (K, side, side): the cells are few (they passed the
    ``min_mean`` test), and a whole-grid product per level cost ~1 ms on a 4K image."""
    if side > 1:
        off = np.arange(side)
        rows = (i[:, None] * side + off)[:, :, None]  # (K, side, 1) level-0 block rows
        cols = (j[:, None] * side + off)[:, None, :]  # (K, 1, side)
        Tv = tab[rows, cols, k[:, None, None]]  # (K, side, side) int64
        Wv = np.where(need[rows, cols], N0[rows, cols], 0) * Tv
        R1, R2 = Wv.sum(axis=(1, 2)), (Wv * Tv).sum(axis=(1, 2))  # (K,)
    else:
        R1 = N0[i, j] * tab[i, j, k]  # (K,)
        R2 = R1 * tab[i, j, k]
    return N[i, j] * (s0 * s0) + (2 * s0 * g) * R1 + (g * g) * R2


def sum_dtype(params: RobustParams, scale: int):
    """Narrowest exact dtype of the pyramid's sums: int32 when the largest block's ``|S|`` (every pixel
    at the dtype's max delta) fits, as for 8- and 16-bit data at the defaults, else int64."""
    side = params.block << (params.levels - 1)
    return np.int32 if side * side * 255 * scale <= np.iinfo(np.int32).max else np.int64


def _candidates(S: np.ndarray, N: np.ndarray, min_mean: float, scale: int):
    """``(aS, (i, j, k))``: ``|S|`` in levels and the cells/channels where ``|S| > min_mean * n`` (levels).

    8-bit (``scale`` 1): integer sums against ``floor(min_mean * n)`` (``x > t <=> x > floor(t)`` for an
    integer ``x``), so the test needs no float copy of ``S``; the cells are found on the channel maximum
    (2-D, contiguous; a 1-D ``nonzero`` of its flat mask), and only their channels tested after."""
    if scale == 1:
        aS = np.abs(S)  # (hb_l, wb_l, C) levels
        lim = np.minimum(np.floor(min_mean * N), np.iinfo(S.dtype).max).astype(S.dtype)  # (hb_l, wb_l)
        cells = np.flatnonzero(_chmax(aS) > lim)  # (K,) flat cell indices
        hit = aS.reshape(-1, aS.shape[2])[cells] > lim.reshape(-1)[cells, None]  # (K, C)
        cell, k = np.nonzero(hit)
        return aS, (*np.divmod(cells[cell], N.shape[1]), k)
    aS = np.abs(S) / scale
    cand = aS > min_mean * N[:, :, None]
    return aS, np.unravel_index(np.flatnonzero(cand), cand.shape)


def flag_area(a: np.ndarray, S: np.ndarray, N: np.ndarray, params: RobustParams, scale: int) -> np.ndarray:
    """(Hb, Wb) bool: level-0 blocks inside a flagged block of any pyramid level (see module docstring).

    ``a``: the reference (H, W, C) in raw units, read only around candidate blocks for the texture.
    ``S`` (Hb, Wb, C), ``N`` (Hb, Wb): pass 1's sums (any integer dtype).
    """
    p = params
    f = 1 << (p.levels - 1)
    hb, wb = N.shape
    ph, pw = -(-hb // f) * f, -(-wb // f) * f
    dt = sum_dtype(p, scale)
    S_, N_ = S, N
    S = np.zeros((ph, pw, S_.shape[2]), dt)  # (ph, pw, C) padded with empty blocks
    S[:hb, :wb] = S_
    N0 = N = np.zeros((ph, pw), dt)  # (ph, pw)
    N[:hb, :wb] = N_
    tex = _Texture(a, p.block, -(-p.spread // p.block), (ph, pw))
    s0, g = float(p.sigma0), float(p.texture_gain) / scale
    area = np.zeros((ph, pw), bool)
    for lev in range(p.levels):
        side = 1 << lev
        if lev:
            S, N = _pool2(S), _pool2(N)
        aS, (i, j, k) = _candidates(S, N, p.min_mean, scale)  # cheap test first; texture and V only there
        flag = np.zeros(N.shape, bool)
        if i.size:
            # V with G (a block's own texture) in place of Rb >= G is a lower bound: a block that fails
            # the test with it fails it with Rb, so the neighbours' texture is read only for the rest.
            need = _cells(i, j, N.shape, side) & ~area  # (ph, pw) their weak level-0 blocks
            low = aS[i, j, k] > p.z * np.sqrt(_var(tex.own(need), need, i, j, k, side, N0, N, s0, g))
            i, j, k = i[low], j[low], k[low]
            if i.size:
                need = _cells(i, j, N.shape, side) & ~area
                hit = aS[i, j, k] > p.z * np.sqrt(_var(tex.require(need), need, i, j, k, side, N0, N, s0, g))
                flag[i[hit], j[hit]] = True
        if flag.any():
            area |= np.repeat(np.repeat(flag, side, axis=0), side, axis=1)
            keep = ~flag
            S, N = S * keep[:, :, None], N * keep
    return area[:hb, :wb]


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


def robust_mask_numpy(a, b, crop, area: np.ndarray, params: RobustParams, scale: int, thr: int):
    """Reference changed pixels of the crop: ``strong | (in flagged area & max_c |d| > thr)``.

    Returns ``(mask, delta)`` (h', w') with ``delta`` the raw max-channel ``|d|`` (int32).
    """
    y0, y1, x0, x1 = crop
    bs = params.block
    d = pixel_delta(a[y0:y1, x0:x1], b[y0:y1, x0:x1])
    strong = strong_in_crop(a, b, crop, window=params.window, margin=margin_raw(params, scale), ad=d)
    sub = area[y0 // bs : -(-y1 // bs), x0 // bs : -(-x1 // bs)]  # crop starts on a block edge
    ar = np.repeat(np.repeat(sub, bs, axis=0), bs, axis=1)[: y1 - y0, : x1 - x0]  # (h', w')
    return strong | (ar & (d > thr)), d
