"""Noise- and gradient-aware change detection (the default ``mode="robust"``), pure NumPy/OpenCV.

RULE_PLACEHOLDER
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
