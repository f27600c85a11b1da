"""The block pyramid of robust mode: which level-0 blocks lie in a flagged block (weak coherent change)."""

from __future__ import annotations

import numpy as np

from imgdiff import morph
from imgdiff.robust.blocks import _pool2
from imgdiff.robust.params import RobustParams
from imgdiff.robust.strong import _chmax
from imgdiff.robust.texture import _Texture


def _cells(i: np.ndarray, j: np.ndarray, shape: tuple[int, int], side: int) -> np.ndarray:
    """(ph, pw) bool: the level-0 blocks under the level cells ``(i, j)`` of a grid of ``shape``."""
    cells = np.zeros((shape[0] * side, shape[1] * side), bool)
    off = np.arange(side)
    cells[(i[:, None] * side + off)[:, :, None], (j[:, None] * side + off)[:, None, :]] = True
    return cells


CODEC_BLOCK = 64
"""Pixels per block of a lossy codec's shared error (JPEG's 8x8), for ``RobustParams.block_noise``."""


def _var(tab, need, i, j, k, side: int, N0, N, s0: float, g: float, bn: float) -> np.ndarray:
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
    return N[i, j] * (s0 * s0 + CODEC_BLOCK * bn * bn) + (2 * s0 * g) * R1 + (g * g) * R2


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


def texture_memo(a: np.ndarray, hb: int, wb: int, params: RobustParams) -> _Texture:
    """The lazy per-block texture of the reference ``a`` for :func:`flag_area` on an (hb, wb) block
    grid; several calls on one pair may share it (it depends on ``a``, ``block``, ``spread``, ``levels``)."""
    f = 1 << (params.levels - 1)
    shape = (-(-hb // f) * f, -(-wb // f) * f)
    return _Texture(a, params.block, -(-params.spread // params.block), shape)


def flag_area(a, S, N, params: RobustParams, scale: int, *, tex: _Texture | None = None) -> np.ndarray:
    """(Hb, Wb) bool: level-0 blocks inside a flagged block of any pyramid level (see :mod:`imgdiff.robust`).

    ``a``: the reference (H, W, C) in raw units, read only around candidate blocks for the texture.
    ``S`` (Hb, Wb, C), ``N`` (Hb, Wb): pass 1's sums (any integer dtype). ``tex``: a
    :func:`texture_memo` shared with other calls on the same pair (else a new one).
    """
    p = params
    f = 1 << (p.levels - 1)
    hb, wb = N.shape
    ph, pw = -(-hb // f) * f, -(-wb // f) * f
    dt = sum_dtype(p, scale)
    S_, N_ = S, N
    S0 = S = np.zeros((ph, pw, S_.shape[2]), dt)  # (ph, pw, C) padded with empty blocks
    S[:hb, :wb] = S_
    N0 = N = np.zeros((ph, pw), dt)  # (ph, pw)
    N[:hb, :wb] = N_
    tex = texture_memo(a, hb, wb, p) if tex is None else tex
    s0, g, bn = float(p.sigma0), float(p.texture_gain) / scale, float(p.block_noise)
    area = np.zeros((ph, pw), bool)
    done = np.zeros((ph, pw), bool)  # level-0 blocks under a flagged cell (out of the sums above)
    for lev in range(p.levels):
        side = 1 << lev
        if lev:
            S, N = _pool2(S), _pool2(N)
        aS, (i, j, k) = _candidates(S, N, p.min_mean, scale)  # cheap test first; texture and V only there
        flag = np.zeros(N.shape, bool)
        if i.size:
            # V with G (a block's own texture) in place of Rb >= G is a lower bound: a block that fails
            # the test with it fails it with Rb, so the neighbours' texture is read only for the rest.
            need = _cells(i, j, N.shape, side) & ~done  # (ph, pw) their weak level-0 blocks
            low = aS[i, j, k] > p.z * np.sqrt(_var(tex.own(need), need, i, j, k, side, N0, N, s0, g, bn))
            i, j, k = i[low], j[low], k[low]
            if i.size:
                need = _cells(i, j, N.shape, side) & ~done
                V = _var(tex.require(need), need, i, j, k, side, N0, N, s0, g, bn)
                hit = aS[i, j, k] > p.z * np.sqrt(V)
                flag[i[hit], j[hit]] = True
                if lev:
                    area |= _coherent(S, N, S0, N0, i[hit], j[hit], k[hit], side, p.min_mean * scale)
        if flag.any():
            up = np.repeat(np.repeat(flag, side, axis=0), side, axis=1)
            if not lev:
                area |= up
            done |= up
            keep = ~flag
            S, N = S * keep[:, :, None], N * keep
    _grow(area, tex, S0, N0, p, scale)
    return area[:hb, :wb]


def _coherent(S, N, S0, N0, i, j, k, side: int, min_mean: float) -> np.ndarray:
    """(ph, pw) bool: the level-0 blocks of the flagged cells ``(i, j)`` (channel ``k``) whose own mean
    delta has the cell's sign and at least half its size (and ``min_mean``, raw units), and that have
    such a neighbour in the cell (8-connected): where the change is, not a lone noisy block."""
    off = np.arange(side)
    rows = (i[:, None] * side + off)[:, :, None]  # (K, side, 1)
    cols = (j[:, None] * side + off)[:, None, :]  # (K, 1, side)
    m = S[i, j, k] / np.maximum(N[i, j], 1)  # (K,) the cell's mean (raw)
    c = S0[rows, cols, k[:, None, None]] / np.maximum(N0[rows, cols], 1)  # (K, side, side)
    ok = (c * np.sign(m)[:, None, None] >= np.maximum(min_mean, np.abs(m) / 2)[:, None, None]) & (
        N0[rows, cols] > 0
    )
    pad = np.pad(ok, ((0, 0), (1, 1), (1, 1))).astype(np.int8)  # (K, side+2, side+2)
    near = sum(
        pad[:, 1 + dy : 1 + dy + side, 1 + dx : 1 + dx + side] for dy in (-1, 0, 1) for dx in (-1, 0, 1)
    )
    ok &= near >= 2  # not alone: a lone block is noise
    out = np.zeros(N0.shape, bool)
    out[np.broadcast_to(rows, ok.shape)[ok], np.broadcast_to(cols, ok.shape)[ok]] = True
    return out


def _grow(area: np.ndarray, tex, S0: np.ndarray, N0: np.ndarray, p: RobustParams, scale: int) -> None:
    """Add to ``area`` (ph, pw) the level-0 blocks next to it (8-neighbours) that pass the weak test
    without the ``block_noise`` term: the edge of a change that only partly covers its blocks."""
    if not area.any():
        return
    ring = morph.dilate(area.view(np.uint8), 3).astype(bool) & ~area
    aS, (i, j, k) = _candidates(S0 * ring[:, :, None], N0, p.min_mean, scale)
    if not i.size:
        return
    need = np.zeros_like(area)
    need[i, j] = True
    s0, g = float(p.sigma0), float(p.texture_gain) / scale
    hit = aS[i, j, k] > p.z * np.sqrt(_var(tex.require(need), need, i, j, k, 1, N0, N0, s0, g, 0.0))
    area[i[hit], j[hit]] = True
