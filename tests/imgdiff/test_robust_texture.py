"""Robust-mode texture allowance: per-block ``G`` and the lazy pyramid vs dense brute-force references."""

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from imgdiff import core, robust
from imgdiff.robust import texture


def _range3_brute(a: np.ndarray) -> np.ndarray:
    """(H, W, C) int64 3x3 max - min of ``a``, window clipped to the image (plain loops)."""
    h, w, c = a.shape
    out = np.zeros((h, w, c), np.int64)
    for y in range(h):
        for x in range(w):
            win = a[max(y - 1, 0) : y + 2, max(x - 1, 0) : x + 2].reshape(-1, c).astype(np.int64)
            out[y, x] = win.max(axis=0) - win.min(axis=0)
    return out


def _G_brute(a: np.ndarray, bs: int) -> np.ndarray:
    """(Hb, Wb, C): max 3x3 range over each ``bs``-px block (edge blocks clipped)."""
    r = _range3_brute(a)
    h, w, c = a.shape
    G = np.zeros((-(-h // bs), -(-w // bs), c), np.int64)
    for i in range(G.shape[0]):
        for j in range(G.shape[1]):
            G[i, j] = r[i * bs : (i + 1) * bs, j * bs : (j + 1) * bs].reshape(-1, c).max(axis=0)
    return G


@st.composite
def images(draw):
    h, w = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    c = draw(st.sampled_from([1, 3, 4]))
    dtype = draw(st.sampled_from([np.uint8, np.uint16]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a = rng.integers(0, np.iinfo(dtype).max + 1, (h, w, c)).astype(dtype)
    if draw(st.booleans()):  # smooth: small ranges, so the max is not always the dtype's full span
        a = (a // 64).astype(dtype)
    return a, draw(st.sampled_from([1, 2, 4, 8, 16]))


@settings(max_examples=60, deadline=None)
@given(images())
def test_block_texture_matches_brute_force(img):
    a, bs = img
    G = _G_brute(a, bs)
    blocks = np.argwhere(np.ones(G.shape[:2], bool))  # (K, 2): every block, edge blocks included
    got = robust.block_texture(a, blocks, bs)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, G[blocks[:, 0], blocks[:, 1]])
    some = blocks[::3][::-1]  # any subset, any order
    np.testing.assert_array_equal(robust.block_texture(a, some, bs), G[some[:, 0], some[:, 1]])


def _flag_area_dense(a, S, N, p: robust.RobustParams, scale: int) -> np.ndarray:
    """The rule of the module docstring written densely: ``R`` on every block, every level summed, the
    coherent children of flagged cells, then the one-block ring without the codec allowance."""
    bs, k = p.block, -(-p.spread // p.block)
    G = _G_brute(a, bs)
    hb, wb, c = G.shape
    Rb = np.zeros_like(G)
    for i in range(hb):
        for j in range(wb):
            Rb[i, j] = G[max(i - k, 0) : i + k + 1, max(j - k, 0) : j + k + 1].reshape(-1, c).max(axis=0)
    f = 1 << (p.levels - 1)
    ph, pw = -(-hb // f) * f, -(-wb // f) * f
    pad3 = ((0, ph - hb), (0, pw - wb), (0, 0))
    S, N = np.pad(S, pad3).astype(np.int64), np.pad(N, pad3[:2]).astype(np.int64)
    S0, N0 = S.copy(), N.copy()
    R1, R2 = np.pad(N[:hb, :wb, None] * Rb, pad3), np.pad(N[:hb, :wb, None] * Rb * Rb, pad3)
    R1_0, R2_0 = R1.copy(), R2.copy()
    area = np.zeros((ph, pw), bool)
    done = np.zeros((ph, pw), bool)
    s0, g, bn = p.sigma0, p.texture_gain / scale, p.block_noise
    for lev in range(p.levels):
        side = 1 << lev
        sums = [x.reshape(ph // side, side, pw // side, side, -1).sum(axis=(1, 3)) for x in (S, R1, R2)]
        n = N.reshape(ph // side, side, pw // side, side).sum(axis=(1, 3))
        aS = np.abs(sums[0]) / scale
        V = n[:, :, None] * (s0 * s0 + 64 * bn * bn) + 2 * s0 * g * sums[1] + g * g * sums[2]
        hit = (aS > p.min_mean * n[:, :, None]) & (aS > p.z * np.sqrt(V))  # (cells, cells, C)
        flag = hit.any(axis=2)
        up = np.repeat(np.repeat(flag, side, axis=0), side, axis=1)
        if lev == 0:
            area |= up
        for ci, cj, ch in zip(*np.nonzero(hit)) if lev else ():
            m = sums[0][ci, cj, ch] / max(n[ci, cj], 1)
            sl = (slice(ci * side, (ci + 1) * side), slice(cj * side, (cj + 1) * side))
            child = S0[sl][:, :, ch] / np.maximum(N0[sl], 1)
            ok = (child * np.sign(m) >= max(p.min_mean * scale, abs(m) / 2)) & (N0[sl] > 0)
            padded = np.pad(ok, 1).astype(int)
            near = sum(
                padded[1 + dy : 1 + dy + side, 1 + dx : 1 + dx + side]
                for dy in (-1, 0, 1)
                for dx in (-1, 0, 1)
            )
            area[sl] |= ok & (near >= 2)
        done |= up
        S, R1, R2, N = S * ~done[:, :, None], R1 * ~done[:, :, None], R2 * ~done[:, :, None], N * ~done
    ring = np.zeros_like(area)  # the 8-neighbours of the area, blocks of the padded grid
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            ring[max(dy, 0) : ph + min(dy, 0), max(dx, 0) : pw + min(dx, 0)] |= area[
                max(-dy, 0) : ph + min(-dy, 0), max(-dx, 0) : pw + min(-dx, 0)
            ]
    ring &= ~area
    aS0 = np.abs(S0) / scale
    V0 = N0[:, :, None] * s0 * s0 + 2 * s0 * g * R1_0 + g * g * R2_0
    grow = ((aS0 > p.min_mean * N0[:, :, None]) & (aS0 > p.z * np.sqrt(V0))).any(axis=2)
    area |= ring & grow
    return area[:hb, :wb]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**31),
    st.sampled_from([(40, 70), (130, 90), (17, 5)]),
    st.sampled_from([0, 4, 8, 20]),
    st.sampled_from([3, 5]),
    st.sampled_from([0.0, 1.0, float("inf")]),
    st.sampled_from([1, 257]),
    st.sampled_from([0.0, 1.5]),
)
def test_lazy_pyramid_matches_dense_rule(seed, shape, spread, levels, gather, scale, block_noise):
    # gather: robust.GATHER_BLOCKS, 0 = always dilate the whole grid, inf = always gather neighbourhoods
    rng = np.random.default_rng(seed)
    h, w = shape
    a = (rng.integers(0, 40, (h, w, 3)) + np.linspace(0, 200, w)[None, :, None]).astype(np.uint8)
    b = a.astype(np.int64) + rng.integers(-3, 4, a.shape)  # zero-mean noise
    y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
    b[y0 : y0 + 20, x0 : x0 + 30] += int(rng.integers(3, 9))  # a weak coherent bump
    b = b.clip(0, 255).astype(np.uint8)
    ly, lx = int(rng.integers(0, h)), min(w - 1, x0 + 30 + int(rng.integers(0, 12)))  # next to the bump
    a[ly, :] = a[:, lx] = b[ly, :] = b[:, lx] = 255  # unchanged texture that only some blocks' neighbours see
    if scale == 257:  # 16-bit: float test of |S| / scale against min_mean * n
        a, b = a.astype(np.uint16) * np.uint16(257), b.astype(np.uint16) * np.uint16(257)
    p = robust.RobustParams(spread=spread, levels=levels, block=4, z=3.0, block_noise=block_noise)
    S, N, _ = robust.block_sums_numpy(a, b, (0, h, 0, w), p, robust.margin_raw(p, scale))
    with mock.patch.object(texture, "GATHER_BLOCKS", gather):
        got = robust.flag_area(a, S, N, p, scale)
    np.testing.assert_array_equal(got, _flag_area_dense(a, S, N, p, scale))


def test_flat_reference_has_no_texture_allowance():
    # A bump of +2 on a flat reference is flagged; next to a strong edge (within spread) it is not.
    # The lossless reading of the pyramid (no codec allowance), as robust mode runs it first.
    a = np.full((64, 64, 1), 100, np.uint8)
    b = a.copy()
    b[8:24, 8:24] += 2
    p = robust.RobustParams(block_noise=0.0)
    assert core.normalise_pair(a, b)[2] == 1
    S, N, _ = robust.block_sums_numpy(a, b, (0, 64, 0, 64), p, robust.margin_raw(p, 1))
    assert robust.flag_area(a, S, N, p, 1)[1:3, 1:3].all()
    a[:, 30] = 255  # a vertical line: G = 155 on block column 3 (x 24..31), Rb = 155 on columns 2..4
    S, N, _ = robust.block_sums_numpy(a, b, (0, 64, 0, 64), p, robust.margin_raw(p, 1))
    area = robust.flag_area(a, S, N, p, 1)
    assert area[1:3, 1].all() and not area[1:3, 2].any()  # x 16..23 is within one block of the line
