"""imgdiff: where two images differ, as exact or noise-aware bounding boxes (pure core on arrays).

``diff(a, b, **options) -> Result``; ``change_mask(a, b, **options) -> (H, W) bool``. File I/O lives
in :mod:`imgdiff.io` and the CLI only. Importing this package never imports Numba or torch.
"""

from imgdiff.api import BACKENDS, change_mask, diff
from imgdiff.core import SizeMismatchError
from imgdiff.result import Region, Result

__all__ = ["BACKENDS", "Region", "Result", "SizeMismatchError", "change_mask", "diff"]
