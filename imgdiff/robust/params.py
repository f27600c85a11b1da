"""The knobs of robust mode (:class:`RobustParams`); the rule itself is in :mod:`imgdiff.robust`."""

from __future__ import annotations

from dataclasses import dataclass, fields


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
    block_noise: float = 1.5
    """Noise allowance (levels) of the mean of each 8x8 group of pixels in the weak test: a lossy codec's
    per-block error (JPEG's DC and chroma quantisation) is shared by the block's pixels, not independent."""
    edge_gain: float = 0.35
    """Extra strong-change margin per level of local edge contrast (the larger max-channel 5x5 range of A
    and B at the pixel): JPEG ringing and chroma bleeding overshoot the 3x3 range near strong edges."""
    fit_ratio: float = 0.5
    """A region is explained by a displacement of A when the least-squares fit leaves less than this
    fraction of the energy of its deltas."""
    fit_gain: float = 1.5
    """In a sub-pixel re-render, a pixel is changed when its residual after the fitted motion exceeds
    ``margin + fit_gain * sqrt(rho) * r3`` (``rho``: the energy fraction the region's fit leaves; ``r3``:
    A's max-channel 3x3 range at the pixel): a pixel's fit error scales with the local contrast."""
    noise_factor: float = 4.0
    """In a region with a weak change, a pixel is changed when ``max_c |d|`` exceeds ``threshold`` and
    ``noise_factor`` times the region's noise (the median ``max_c |d|`` of its other pixels: 0 on a
    lossless pair, the codec's noise on a lossy one)."""
    shift_px: float = 0.75
    """Fitted displacement (pixels) from which an explained region is a layout shift (a change); below
    it the region is a sub-pixel re-render (anti-aliasing), and only pixels the motion leaves
    unexplained by more than ``margin`` count."""

    def __post_init__(self) -> None:
        if self.block not in (1, 2, 4, 8, 16):
            raise ValueError(f"robust block must be a power of two <= 16, got {self.block}")
        if self.window < 3 or self.window % 2 == 0:
            raise ValueError(f"robust window must be odd and >= 3, got {self.window}")
        if self.spread < 0:
            raise ValueError(f"robust spread must be >= 0 px, got {self.spread}")
        if self.levels < 1:
            raise ValueError(f"robust levels must be >= 1, got {self.levels}")
        if not 0 < self.fit_ratio <= 1:
            raise ValueError(f"robust fit_ratio must be in (0, 1], got {self.fit_ratio}")
        nonneg = ("margin", "sigma0", "texture_gain", "z", "min_mean", "block_noise", "edge_gain", "fit_gain")
        nonneg += ("shift_px", "noise_factor")
        for f in nonneg:
            if getattr(self, f) < 0:
                raise ValueError(f"robust {f} must be >= 0, got {getattr(self, f)}")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
