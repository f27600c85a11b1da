"""The last step of robust mode (the rule is in :mod:`imgdiff.robust`): the changed pixels of the
candidate tiles, in NumPy, shared by every backend (so all three give identical answers).

Candidate tiles can hold a change: a flagged pyramid block, a strong pixel of pass 1, or a max-channel
``|d|`` above ``margin`` (a moved edge), plus their 8-neighbour tiles. They are gathered with a
``PAD``-px border (indices clipped to the image, which for a window max or min equals clipping the
window) as (K, T+2P, T+2P, C) patches (T = ``TILE``, P = ``PAD``) and grouped into regions, 8-connected
groups of candidate tiles. Everything is vectorised over the K tiles; per-region sums are
``bincount`` s over the tiles' region labels, so the work grows with the candidate area only.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.lib.stride_tricks import as_strided

from imgdiff import morph
from imgdiff.regions import TILE
from imgdiff.robust.params import RobustParams
from imgdiff.robust.pyramid import flag_area, texture_memo
from imgdiff.robust.strong import _chmax, margin_raw
from imgdiff.robust.sums import area_tiles

PAD = 4
"""Border of the gathered tile patches: the 5x5 opening reads 4 px around a pixel."""
MAX_DISP = 1.5
"""Largest fitted displacement (pixels) that counts as a motion: on a smooth gradient a far larger
coefficient can mimic any offset, which is a change, not a one-pixel move."""
WEIGHT_SLACK = 0.25
"""A motion resamples A: the fit's weights of A and its three translations (1 - c1 - c2 - c3, c1, c2,
c3) must be interpolation weights, each at least ``-WEIGHT_SLACK`` (else the displacement is infinite)."""
EDGE_LEVEL = 0.6
"""On a lossy pair a change's edge is where its delta along the mean, 3x3-averaged, passes this fraction
of the plateau's: a codec blurs the change (JPEG's chroma over about two pixels) and lowers its plateau,
so the half level lies outside the true edge."""
_SHIFTS = ((1, 0), (-1, 0), (0, 1), (0, -1))  # (dx, dy) probes that pick each region's fit directions


def _win(x: np.ndarray, k: int, op) -> np.ndarray:
    """``op`` (np.maximum / np.minimum) over k x k windows of axes 1, 2: (K, n, n, ...) -> (K, m, m, ...),
    ``m = n - k + 1``."""
    n = x.shape[1] - k + 1
    out = x[:, :, :n].copy()
    for t in range(1, k):
        op(out, x[:, :, t : t + n], out=out)
    rows = out[:, :n].copy()
    for t in range(1, k):
        op(rows, out[:, t : t + n], out=rows)
    return rows


def _gather(img: np.ndarray, ty: np.ndarray, tx: np.ndarray) -> np.ndarray:
    """(K, TILE + 2*PAD, TILE + 2*PAD, C) patches of the tiles (ty, tx), border indices clipped: a strided
    view of the image for the patches inside it, clipped fancy indices for the others."""
    img = np.ascontiguousarray(img)
    h, w, c = img.shape
    n = TILE + 2 * PAD
    out = np.empty((len(ty), n, n, c), img.dtype)
    ni, nj = (h - TILE - PAD) // TILE, (w - TILE - PAD) // TILE  # tiles 1..ni, 1..nj: border inside
    inner = (ty >= 1) & (ty <= ni) & (tx >= 1) & (tx <= nj)
    if inner.any():
        s0, s1, s2 = img.strides
        shape, strides = (ni, nj, n, n, c), (TILE * s0, TILE * s1, s0, s1, s2)
        view = as_strided(img[TILE - PAD :, TILE - PAD :], shape, strides)  # tile (i, j) at view[i-1, j-1]
        out[inner] = view[ty[inner] - 1, tx[inner] - 1]
    if not inner.all():
        off = np.arange(-PAD, TILE + PAD)
        rows = np.clip(ty[~inner, None] * TILE + off, 0, h - 1)  # (K'', T+2P)
        cols = np.clip(tx[~inner, None] * TILE + off, 0, w - 1)
        out[~inner] = img[rows[:, :, None], cols[:, None, :]]
    return out


def _inner(x: np.ndarray, p: int = PAD) -> np.ndarray:
    return x[:, p : x.shape[1] - p, p : x.shape[2] - p]


def _strong(PA, PB, d, valid, margin: float, gain: float):
    """``(strong, r3)`` (K, T, T): the strong pixels, outside the other image's 3x3 range by more than
    ``margin + gain * r5`` (``r5``: the larger max-channel 5x5 range of A and B at p), or inside a 3x3
    window (centred on the image) whose nine pixels all have ``max_c |d| > margin``; and ``r3``, A's
    max-channel 3x3 range."""
    ex = np.zeros(d.shape[:3], np.int32)
    r3 = None
    for ref, other in ((PA, _inner(PB)), (PB, _inner(PA))):
        hi = _inner(_win(ref, 3, np.maximum), PAD - 1).astype(np.int32)  # (K, T, T, C)
        lo = _inner(_win(ref, 3, np.minimum), PAD - 1).astype(np.int32)
        np.maximum(ex, _chmax(np.maximum(other - hi, lo - other)), out=ex)
        r3 = _chmax(hi - lo) if r3 is None else r3  # (K, T, T) A's 3x3 range
    r5 = _inner(
        np.maximum(
            _chmax(_win(PA, 5, np.maximum).astype(np.int32) - _win(PA, 5, np.minimum)),
            _chmax(_win(PB, 5, np.maximum).astype(np.int32) - _win(PB, 5, np.minimum)),
        ),
        PAD - 2,
    )  # (K, T, T)
    strong = ex > margin + gain * r5  # the edge-aware margin
    big = _chmax(np.abs(PB.astype(np.int32) - PA)) > margin  # (K, T+2P, T+2P) incl. the border
    strong |= _opened(big, valid, 3)
    return strong, r3


def _opened(big: np.ndarray, valid: np.ndarray, k: int) -> np.ndarray:
    """(K, T, T) bool: pixels in a k x k window, centred on the image, whose pixels all are ``big``
    (K, T+2P, T+2P); windows clipped to the image (the border copies edge pixels, which equals it)."""
    r = k // 2
    full = _win(big, k, np.minimum) & _inner(valid, r)  # (K, T+2P-2r, ...) centres of full windows
    return _inner(_win(full, k, np.maximum), PAD - 2 * r)


def _fit(PA, d, use, lab, n: int):
    """Per region, the least-squares displacement fit of ``d`` (K, T, T, C) by differences of A.

    Bases ``u1 = A(p - (sx, 0)) - A(p)``, ``u2 = A(p - (0, sy)) - A(p)``, ``u3 = A(p - (sx, sy)) - A(p)``,
    with ``sx``, ``sy`` the signs whose one-pixel translation of A matches B best; coefficients shared
    by the channels and pixels of the region (linear interpolation, in the small-motion limit).
    Returns ``(ratio (n,), disp (n,), model (K, T, T, C))``: the energy left over ``sum r**2 / sum d**2``,
    the fitted displacement ``max(|c1 + c3|, |c2 + c3|)`` in pixels, and the fitted ``d``. Only the
    tiles holding a ``use`` pixel take part (float32 per tile, float64 sums per region)."""
    model = np.zeros(d.shape, np.float32)
    sel = np.flatnonzero(use.any(axis=(1, 2)))  # (K',) tiles with changed pixels
    PA, d, use, lab = PA[sel], d[sel], use[sel], lab[sel]
    a = PA.astype(np.float32)
    A0 = _inner(a)  # (K', T, T, C)

    def moved(dx: int, dy: int) -> np.ndarray:  # A(p - (dx, dy)) on the tiles
        return a[:, PAD - dy : PAD - dy + TILE, PAD - dx : PAD - dx + TILE]

    wgt = use[..., None].astype(np.float32)  # (K', T, T, 1): the changed pixels of the image
    df = d * wgt
    e = [np.bincount(lab, ((df - (moved(x, y) - A0) * wgt) ** 2).sum(axis=(1, 2, 3)), n) for x, y in _SHIFTS]
    sx = np.where(e[0] <= e[1], 1, -1)[lab]  # (K,) per tile, from its region
    sy = np.where(e[2] <= e[3], 1, -1)[lab]
    k = np.arange(len(lab))
    U = np.empty((3, *d.shape), np.float32)  # (3, K', T, T, C)
    for i, (fx, fy) in enumerate(((1, 0), (0, 1), (1, 1))):
        ys = PAD - fy * sy[:, None] + np.arange(TILE)  # (K, T)
        xs = PAD - fx * sx[:, None] + np.arange(TILE)
        U[i] = (a[k[:, None, None], ys[:, :, None], xs[:, None, :]] - A0) * wgt
    G = np.empty((n, 3, 3))
    r = np.empty((n, 3))
    for i in range(3):
        r[:, i] = np.bincount(lab, (U[i] * df).sum(axis=(1, 2, 3)), n)
        for j in range(i, 3):
            G[:, i, j] = G[:, j, i] = np.bincount(lab, (U[i] * U[j]).sum(axis=(1, 2, 3)), n)
    E0 = np.bincount(lab, (df * df).sum(axis=(1, 2, 3)), n)
    ridge = 1e-6 * np.trace(G, axis1=1, axis2=2) + 1e-3
    c = np.linalg.solve(G + ridge[:, None, None] * np.eye(3), r[:, :, None])[:, :, 0]  # (n, 3)
    left = np.maximum(E0 - (c * r).sum(axis=1), 0.0)
    ratio = np.where(E0 > 0, left / np.maximum(E0, 1e-12), 1.0)
    disp = np.maximum(np.abs(c[:, 0] + c[:, 2]), np.abs(c[:, 1] + c[:, 2]))
    weights = np.concatenate([1 - c.sum(axis=1, keepdims=True), c], axis=1)  # (n, 4) of A, A_x, A_y, A_xy
    disp = np.where((weights >= -WEIGHT_SLACK).all(axis=1), disp, np.inf)  # not an interpolation: no motion
    model[sel] = np.einsum("ik,iklmn->klmn", c[lab].T.astype(np.float32), U)  # (K', T, T, C)
    return ratio, disp, model


def _near(area, strong, ty, tx, ay, ax, bs: int) -> np.ndarray:
    """(K, T, T) bool: pixels within one block of a flagged block (``area`` (Hb, Wb)) or of a block that
    holds a strong pixel (``strong`` (K, T, T) on the tiles (ty, tx))."""
    f = TILE // bs
    blocks = area.copy()  # (Hb, Wb)
    sb = strong.reshape(len(ty), f, bs, f, bs).any(axis=(2, 4))  # (K, f, f)
    by = np.minimum(ty[:, None] * f + np.arange(f), blocks.shape[0] - 1)  # (K, f)
    bx = np.minimum(tx[:, None] * f + np.arange(f), blocks.shape[1] - 1)
    blocks[by[:, :, None], bx[:, None, :]] |= sb
    close = morph.dilate(blocks.view(np.uint8), 3).astype(bool)  # (Hb, Wb)
    return close[ay[:, :, None], ax[:, None, :]]


def _win_mean(x: np.ndarray, k: int) -> np.ndarray:
    """k x k mean over axes 1, 2: (K, n, n) -> (K, n-k+1, n-k+1)."""
    m = x.shape[1] - k + 1
    rows = sum(x[:, :, t : t + m] for t in range(k))
    return sum(rows[:, t : t + m] for t in range(k)) / float(k * k)


def _settle(d, dpad, ad, strong, flagged, near, inside, lab, n: int, p: RobustParams, thr: int, lossy: bool):
    """(K, T, T) bool: the changed pixels of the regions no displacement explains.

    Lossless pair (``lossy`` False: no delta above ``thr`` outside the candidate regions): the strong
    pixels and every pixel with ``max_c |d| > thr``. Lossy pair, per region: ``near``, the pixels within
    one block of a flagged block or of a block holding a strong pixel (the change); ``noise``, the
    median ``max_c |d|`` of its other pixels; ``mu``, the mean delta of the change's plateau (its
    flagged or strong pixels at least 3/4 as far along the mean as it); ``t = max(thr, noise_factor *
    noise, EDGE_LEVEL * |mu|)``. Changed: the strong pixels whose delta along ``mu`` exceeds ``t``, and, when
    ``|mu| > noise_factor * noise``, the pixels near the change whose delta along ``mu``, averaged over
    their 3x3 neighbourhood, exceeds ``t``: the edge of the change, not the codec's
    noise or colour bleeding."""
    if not lossy:
        return strong | (ad > thr)
    noise = _median(ad, inside & ~near & ~strong, lab, n)  # (n,)
    core = (flagged | strong) & inside  # (K, T, T)
    for _ in range(2):  # the mean delta of the change, then of its plateau
        mu = _mean(d, core, lab, n)  # (n, C)
        norm = np.sqrt((mu * mu).sum(axis=1))  # (n,)
        unit = mu / np.maximum(norm, 1e-9)[:, None]
        along = (d * unit[lab][:, None, None, :]).sum(axis=3)  # (K, T, T) delta along the mean
        core = (flagged | strong) & inside & (along > (0.75 * norm)[lab][:, None, None])
    smooth = _inner(_win_mean((dpad * unit[lab][:, None, None, :]).sum(axis=3), 3), PAD - 1)  # (K, T, T)
    t = np.maximum(np.maximum(thr, p.noise_factor * noise), EDGE_LEVEL * norm)[lab][:, None, None]
    real = (norm > p.noise_factor * noise)[lab][:, None, None]  # the change stands out of the noise
    return (real & near & (smooth > t)) | (strong & (along > t))


def _mean(d: np.ndarray, use: np.ndarray, lab: np.ndarray, n: int) -> np.ndarray:
    """(n, C) per region, the mean of ``d`` (K, T, T, C) over the pixels ``use`` (K, T, T) of its tiles."""
    cnt = np.bincount(lab, use.sum(axis=(1, 2)), n)
    tot = [np.bincount(lab, (d[..., ch] * use).sum(axis=(1, 2)), n) for ch in range(d.shape[3])]
    return np.stack(tot, axis=1) / np.maximum(cnt, 1)[:, None]


def _median(x: np.ndarray, use: np.ndarray, lab: np.ndarray, n: int) -> np.ndarray:
    """(n,) per region, the median of ``x`` (K, T, T) over the pixels ``use`` of its tiles (0 if none)."""
    labs = np.broadcast_to(lab[:, None, None], x.shape)[use]
    vals = x[use]
    order = np.lexsort((vals, labs))
    cnt = np.bincount(labs, minlength=n)
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    out = np.zeros(n, np.float64)
    some = cnt > 0
    out[some] = vals[order][start[some] + cnt[some] // 2]
    return out


def _candidates(area, stiles, grid, margin: float, bs: int) -> np.ndarray:
    """(Ht, Wt) bool: tiles with a flagged block, a strong pixel or ``max_c |d| > margin``, and their
    8-neighbours (a change's edges)."""
    cand = area_tiles(area, bs, *grid.shape) | stiles | (grid > margin)
    return morph.dilate(cand.view(np.uint8), 3).astype(bool)


def changed_pixels(a, b, S: np.ndarray, N: np.ndarray, stiles: np.ndarray, grid: np.ndarray,
                   params: RobustParams, scale: int, thr: int):  # fmt: skip
    """The changed pixels of a normalised pair (H, W, C): ``None`` or ``(mask, delta, (y0, x0))`` with
    ``mask`` (h', w') bool and ``delta`` (h', w') the raw max-channel ``|d|`` on the box of the
    candidate tiles starting at (y0, x0).

    ``S``, ``N``: pass 1's block sums; ``stiles`` (Ht, Wt) bool: tiles with a pass-1 strong pixel;
    ``grid`` (Ht, Wt): the max-pooled raw ``|d|`` per ``TILE`` tile. The pyramid first runs without the
    codec allowance (``block_noise`` 0); when the pair differs by more than ``thr`` outside every
    candidate region so found (a lossy re-encode), it runs again with it."""
    p = params
    h, w, _ = a.shape
    margin = margin_raw(p, scale)
    tex = texture_memo(a, *N.shape, p)  # the reference's texture, shared by both readings
    area = flag_area(a, S, N, replace(p, block_noise=0.0), scale, tex=tex)  # (Hb, Wb) as if lossless
    cand = _candidates(area, stiles, grid, margin, p.block)
    lossy = bool((grid[~cand] > thr).any())  # changes outside every candidate region: a lossy codec
    if lossy and p.block_noise:
        area = flag_area(a, S, N, p, scale, tex=tex)
        cand = _candidates(area, stiles, grid, margin, p.block)
    if not cand.any():
        return None
    n, labels = morph.components8(cand.view(np.uint8))
    ty, tx = np.nonzero(cand)
    lab = labels[ty, tx]  # (K,) region of each tile
    PA, PB = _gather(a, ty, tx), _gather(b, ty, tx)  # (K, T+2P, T+2P, C)
    off = np.arange(-PAD, TILE + PAD)
    valid = ((ty[:, None] * TILE + off) < h)[:, :, None] & ((tx[:, None] * TILE + off) < w)[:, None, :]
    valid &= ((ty[:, None] * TILE + off) >= 0)[:, :, None] & ((tx[:, None] * TILE + off) >= 0)[:, None, :]
    inside = _inner(valid)  # (K, T, T) pixels of the image
    d = _inner(PB).astype(np.int32) - _inner(PA)  # (K, T, T, C) signed raw deltas
    ad = _chmax(np.abs(d))  # (K, T, T)
    f = TILE // p.block
    hb, wb = area.shape
    ay = np.clip(ty[:, None] * f + np.arange(TILE) // p.block, 0, hb - 1)  # (K, T) block rows
    ax = np.clip(tx[:, None] * f + np.arange(TILE) // p.block, 0, wb - 1)
    flagged = area[ay[:, :, None], ax[:, None, :]]  # (K, T, T)
    strong, r3 = _strong(PA, PB, d, valid, margin, p.edge_gain)
    ratio, disp, model = _fit(PA, d, inside & (ad > thr), lab, n)
    explained = (ratio < p.fit_ratio) & (disp <= MAX_DISP)  # (n,) per region
    shift = (explained & (disp >= p.shift_px))[lab][:, None, None]  # (K, 1, 1)
    resampled = (explained & (disp < p.shift_px))[lab][:, None, None]
    spread = p.fit_gain * np.sqrt(ratio)[lab][:, None, None] * r3  # (K, T, T) the fit's expected error
    residual = _chmax(np.abs(d - model)) > margin + spread
    dpad = PB.astype(np.int32) - PA  # (K, T+2P, T+2P, C) signed raw deltas with the border
    near = _near(area, strong, ty, tx, ay, ax, p.block)
    normal = _settle(d, dpad, ad, strong, flagged, near, inside, lab, n, p, thr, lossy)
    mask = np.where(shift, ad > thr, normal)
    if resampled.any():  # the fit's residual, and coherent 5x5 blocks no re-render makes
        block = _opened(_chmax(np.abs(dpad)) > margin, valid, 5)  # (K, T, T)
        mask = np.where(resampled, residual | block, mask)
    mask &= inside
    y0, x0 = int(ty.min()) * TILE, int(tx.min()) * TILE
    y1, x1 = min(h, (int(ty.max()) + 1) * TILE), min(w, (int(tx.max()) + 1) * TILE)
    out = np.zeros((-(-(y1 - y0) // TILE) * TILE, -(-(x1 - x0) // TILE) * TILE), bool)
    delta = np.zeros(out.shape, np.int32)
    ry, rx = (ty * TILE - y0)[:, None] + np.arange(TILE), (tx * TILE - x0)[:, None] + np.arange(TILE)
    out[ry[:, :, None], rx[:, None, :]] = mask
    delta[ry[:, :, None], rx[:, None, :]] = ad
    return out[: y1 - y0, : x1 - x0], delta[: y1 - y0, : x1 - x0], (y0, x0)
