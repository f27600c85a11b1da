"""Real photographs for imgdiff's tests and benchmarks, from files that registry packages ship.

No download: scikit-image's wheel carries a few photos under ``skimage/data/`` (found without
importing scikit-image) and matplotlib's carries ``grace_hopper.jpg`` under ``mpl-data/sample_data``.
API::

    PHOTOS                                  # names, more than one source
    photo(name) -> (H, W, 3) uint8          # the file as shipped, RGB
    photo_4k(name, h=2160, w=3840) -> (h, w, 3) uint8   # bicubic upscale (what users diff at 4K)

``photo_4k`` keeps the upscale in memory (a few per process); callers must not write into it.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache

import cv2
import numpy as np

# name -> (package, path inside the package)
_SOURCES = {
    "astronaut": ("skimage", "data/astronaut.png"),
    "coffee": ("skimage", "data/coffee.png"),
    "chelsea": ("skimage", "data/chelsea.png"),
    "rocket": ("skimage", "data/rocket.jpg"),
    "grace_hopper": ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
}
PHOTOS = tuple(_SOURCES)


def photo_path(name: str) -> str:
    """Path of the shipped file for ``name`` (one of :data:`PHOTOS`)."""
    if name not in _SOURCES:
        raise KeyError(f"unknown photo {name!r}; expected one of {PHOTOS}")
    package, rel = _SOURCES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"photo {name!r} comes with the {package} package, which is not installed; "
            "install the test extra: pip install -e '.[test]'"
        )
    return os.path.join(spec.submodule_search_locations[0], rel)


@lru_cache(maxsize=8)
def photo(name: str) -> np.ndarray:
    """The photo as shipped, (H, W, 3) uint8 RGB (read-only)."""
    bgr = cv2.imread(photo_path(name), cv2.IMREAD_COLOR)
    if bgr is None:
        raise OSError(f"could not decode {photo_path(name)}")
    rgb = np.ascontiguousarray(bgr[:, :, ::-1])
    rgb.setflags(write=False)
    return rgb


@lru_cache(maxsize=4)
def photo_4k(name: str, h: int = 2160, w: int = 3840) -> np.ndarray:
    """``photo(name)`` upscaled to (h, w) with bicubic interpolation (read-only)."""
    up = cv2.resize(photo(name), (w, h), interpolation=cv2.INTER_CUBIC)
    up.setflags(write=False)
    return up
