"""Noise- and gradient-aware change detection (the default ``mode="robust"``), pure NumPy/OpenCV.

The rule. With ``d = B - A`` the signed per-channel delta in 0-255 levels (16-bit is divided by 257;
A is the reference), a pixel is changed when it belongs to a change that neither codec noise nor a
motion of A explains: (1) *strong*: B lies outside A's 3x3 range at p (or A outside B's) by more than
``margin + edge_gain * r5`` (``r5`` the larger max-channel 5x5 range of A and B at p, which absorbs
JPEG ringing and chroma bleeding at strong edges), or p lies in a 3x3 window whose pixels all have
``max_c |d| > margin``; (2) *weak*: ``max_c |d| > threshold`` and p lies in a flagged block of a
pyramid of blocks of side ``block * 2**l``, where a block is flagged when, in some channel, the sum
``S`` of the deltas of its ``n`` pixels not strong at ``edge_gain`` 0 has ``|S| > min_mean * n`` and
``|S| > z * sqrt(V)``, ``V = sum_p sigma_p**2 + 64 * n * block_noise**2`` with ``sigma_p = sigma0 +
texture_gain * R(p)`` (``R`` the reference's largest 3x3 range within ``spread`` px: edges and
texture), the ``block_noise`` term (a lossy codec's error is shared by its 8x8 blocks) counted only
when the pair differs by more than ``threshold`` outside every change found without it, a level
above 0 marking the level-0 blocks of a flagged cell that hold at least half its mean (not alone),
and the ring of blocks next to the flagged ones that pass the test without ``block_noise`` joining
them. Changes are then judged by region (8-connected groups of 16-px tiles that hold a strong pixel,
a flagged block or ``max_c |d| > margin``, with their neighbour tiles) by a coherent-displacement
test: ``d`` over the region's pixels with ``max_c |d| > threshold`` is fitted by least squares as a
resampling of A, ``c1 (A(p - sx) - A) + c2 (A(p - sy) - A) + c3 (A(p - sx - sy) - A)`` with one-pixel
steps ``sx``, ``sy`` towards the better-matching translation. Noise and real edits keep most of their
energy under it, a motion does not; so when the fit leaves less than ``fit_ratio`` of the energy with
interpolation weights (each of ``1 - c1 - c2 - c3, c1, c2, c3`` above -0.25) and a displacement
``max(|c1 + c3|, |c2 + c3|)`` of at most 1.5 px, a displacement of at least ``shift_px`` is a layout
shift (every pixel of the region with ``max_c |d| > threshold`` is changed) and a smaller one is a
sub-pixel re-render (only pixels whose residual exceeds ``margin + fit_gain * sqrt(rho) * r3``, with
``rho`` the energy left and ``r3`` A's max-channel 3x3 range, or that lie in a 5x5 window of
``max_c |d| > margin``, are changed). Otherwise, on a lossless pair, the region's strong pixels
and all its pixels with ``max_c |d| > threshold`` are changed; on a lossy pair, with ``mu`` the mean
delta of the change's plateau (its flagged or strong pixels at least 3/4 as far along ``mu``) and
``noise`` the region's median ``max_c |d|`` away from the change, the strong pixels whose delta along
``mu`` exceeds ``t = max(threshold, noise_factor * noise, 0.6 |mu|)`` and, when ``|mu| > noise_factor
* noise``, the pixels within one block of the change whose delta along ``mu``, averaged over their
3x3 neighbourhood, exceeds ``t``: the edge of the change (a codec blurs it and lowers its plateau, so
the level sits above half), not the codec's noise.

Defaults and meanings: :class:`RobustParams` (``threshold`` 2 levels is the API's). The thresholds
were set on the golden cases and the real-photo corpus (``tests/imgdiff/realcases.py``; all five
photos were in view while tuning, so it is a regression suite, not a held-out test). Where things
are computed: pass 1's
block sums (:mod:`.sums`, and the Numba/CUDA kernels), the strong test (:mod:`.strong`), the
reference's texture (:mod:`.texture`), the pyramid (:mod:`.pyramid`), exact integer block arithmetic
(:mod:`.blocks`) and the per-region judgement (:mod:`.verify`, NumPy for every backend, on the
candidate tiles only). All sums before the fit are exact integers, so every backend flags the same
blocks.
"""

from __future__ import annotations

from imgdiff.robust.blocks import _block_sum, _block_sum_diff, _pool2
from imgdiff.robust.params import RobustParams
from imgdiff.robust.pyramid import flag_area, sum_dtype
from imgdiff.robust.strong import (
    _strong_boxes,
    margin_raw,
    strong_in_crop,
    strong_mask,
    strong_points,
)
from imgdiff.robust.sums import area_tiles, block_sums_numpy, crop_box, init_sums
from imgdiff.robust.texture import block_texture
from imgdiff.robust.verify import changed_pixels

__all__ = [
    "RobustParams",
    "_block_sum",
    "_block_sum_diff",
    "_pool2",
    "_strong_boxes",
    "area_tiles",
    "block_sums_numpy",
    "block_texture",
    "changed_pixels",
    "crop_box",
    "flag_area",
    "init_sums",
    "margin_raw",
    "strong_in_crop",
    "strong_mask",
    "strong_points",
    "sum_dtype",
]
