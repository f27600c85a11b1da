"""imgdiff: where two images differ, as exact or noise-aware bounding boxes (pure core on arrays).

``diff(a, b, **options) -> Result``; ``change_mask(a, b, **options) -> (H, W) bool``;
``diff_and_mask`` returns both from one detection pass. File I/O lives in :mod:`imgdiff.io` and the
CLI only. Importing this package imports nothing heavy (names load on first use, PEP 562), so the
CLI can start reading images before NumPy/OpenCV are imported; it never imports Numba or torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BACKENDS": "imgdiff.api",
    "change_mask": "imgdiff.api",
    "diff": "imgdiff.api",
    "diff_and_mask": "imgdiff.api",
    "SizeMismatchError": "imgdiff.core",
    "Region": "imgdiff.result",
    "Result": "imgdiff.result",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'imgdiff' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
