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
   anti-aliasing.
2. **Coherent weak change**: ``p`` lies in a *flagged block* and ``max_c |d[p]| > threshold``.
   Blocks form a pyramid of sides ``block * 2**l`` (``l < levels``). A block is flagged when, in
   some channel, the sum ``S`` of signed deltas of its non-strong pixels satisfies
   ``|S| > z * sqrt(V)`` and ``|S| > min_mean * n``, with ``n`` its pixel count and
   ``V = sum_p sigma_p**2``, ``sigma_p = sigma0 + texture_gain * R[p]`` the per-pixel noise
   allowance, where ``R[p]`` is the largest 3x3 range (max - min) of ``A`` within ``spread`` pixels
   of ``p``: it grows with the reference's local gradient/texture and is ``sigma0`` in flat areas
   (the ``spread`` accounts for JPEG spreading an edge's error over its 8x8 / 16x16 blocks).
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
They were chosen on the golden cases in ``tests/imgdiff/test_robust_golden.py`` (:mod:`imgdiff.cases`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import cv2
import numpy as np

from imgdiff.core import BLOCK


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
    """The noise allowance at p uses the largest 3x3 range within this many px (JPEG spreads edge
    errors over its 8x8 / 16x16 blocks)."""
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


def _morph(x: np.ndarray, op, k: int = 3) -> np.ndarray:
    return op(x, np.ones((k, k), np.uint8)).reshape(x.shape)  # OpenCV drops a trailing channel axis of 1


def _pool2(x: np.ndarray) -> np.ndarray:
    """Sum 2x2 neighbours over the first two axes."""
    h, w = x.shape[:2]
    return x.reshape(h // 2, 2, w // 2, 2, *x.shape[2:]).sum(axis=(1, 3))


def robust_changes(
    a: np.ndarray, b: np.ndarray, *, scale: int, grid: np.ndarray, threshold: float, params: RobustParams
):
    """Changed pixels of a normalised pair. Returns ``None`` or ``(mask, delta, (oy, ox))``.

    ``grid`` (Hb, Wb) is the max-pooled raw delta on ``BLOCK`` tiles; only the bounding box of
    tiles with any change (plus one tile of context for the 3x3 neighbourhoods) is analysed.
    """
    p = params
    nz = np.nonzero(grid > 0)
    if nz[0].size == 0:
        return None
    h, w, c = a.shape
    y0, y1 = max(nz[0].min() - 1, 0) * BLOCK, min((nz[0].max() + 2) * BLOCK, h)
    x0, x1 = max(nz[1].min() - 1, 0) * BLOCK, min((nz[1].max() + 2) * BLOCK, w)
    inv = np.float32(1.0 / scale)
    A = a[y0:y1, x0:x1].astype(np.float32) * inv  # (h', w', C)
    B = b[y0:y1, x0:x1].astype(np.float32) * inv
    hh, ww = A.shape[:2]
    k = p.window
    amin, amax = _morph(A, cv2.erode, k), _morph(A, cv2.dilate, k)
    bmin, bmax = _morph(B, cv2.erode, k), _morph(B, cv2.dilate, k)
    m = np.float32(p.margin)
    strong = ((B > amax + m) | (B < amin - m) | (A > bmax + m) | (A < bmin - m)).any(axis=2)  # (h', w')
    d = B - A  # (h', w', C) signed
    ad = np.abs(d).max(axis=2)  # (h', w')
    rng = (amax - amin) if k == 3 else (_morph(A, cv2.dilate) - _morph(A, cv2.erode))  # (h', w', C)
    if p.spread:
        rng = _morph(rng, cv2.dilate, 2 * p.spread + 1)
    sig = np.float32(p.sigma0) + np.float32(p.texture_gain) * rng
    weak = ~strong
    top = p.block << (p.levels - 1)
    ph, pw = -(-hh // top) * top, -(-ww // top) * top
    S = np.zeros((ph, pw, c), np.float32)
    V = np.zeros((ph, pw, c), np.float32)
    N = np.zeros((ph, pw), np.float32)
    S[:hh, :ww] = d * weak[:, :, None]
    V[:hh, :ww] = sig * sig * weak[:, :, None]
    N[:hh, :ww] = weak
    s = p.block
    S = S.reshape(ph // s, s, pw // s, s, c).sum(axis=(1, 3), dtype=np.float64)  # (hb, wb, C)
    V = V.reshape(ph // s, s, pw // s, s, c).sum(axis=(1, 3), dtype=np.float64)
    N = N.reshape(ph // s, s, pw // s, s).sum(axis=(1, 3), dtype=np.float64)  # (hb, wb)
    area = np.zeros((ph, pw), dtype=bool)
    for lev in range(p.levels):
        if lev:
            S, V, N = _pool2(S), _pool2(V), _pool2(N)
        aS = np.abs(S)
        flag = ((aS > p.z * np.sqrt(V)) & (aS > p.min_mean * N[:, :, None])).any(axis=2)  # (hb, wb)
        if flag.any():
            side = p.block << lev
            area |= np.repeat(np.repeat(flag, side, axis=0), side, axis=1)
            keep = ~flag
            S, V, N = S * keep[:, :, None], V * keep[:, :, None], N * keep
    mask = strong | (area[:hh, :ww] & (ad > np.float32(threshold)))
    if not mask.any():
        return None
    return mask, ad, (int(y0), int(x0))
