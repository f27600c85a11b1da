"""Separate objects in a box of a note image: the region proposer of the ``objects`` and ``find`` tools.

    found = located(task, image=2, box=[0.36, 0.36, 0.66, 0.66])      # [Found(box, pixels), ...]
    x0, y0, x1, y1 = cutout_box(found[0].box, W, H)                    # its padded square cut-out

No model: in the crop of ``box``, an object is a connected region (8-neighbours) of pixels that differ
from the crop's median colour by more than :data:`CONTRAST` in some channel, at least :data:`MIN_PIXELS`
large (and at most ``max_size`` of the box's area when given), and not touching the crop's edge (a region
cut by the box is left to a wider box; the frame of another surface around a tray is one such region).
Each object's cut-out is the square around its bounding box padded by :data:`PAD` source pixels. Objects
come in reading order (rows of centres :data:`ROW_GAP` px apart or more, top to bottom; left to right
within a row), at most :data:`MAX_OBJECTS`, the largest kept when there are more.

It suits flat backgrounds (a tray, a table, a screenshot, a document): on a textured one the median is
no background and the regions are noise. Importing this module registers no tool.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rl.agent.task import AgentTask
from rl.agent.tools import WHOLE, box_pixels

CONTRAST = 40
"""Least per-channel difference (0-255) from the crop's median colour that makes a pixel an object's."""
MIN_PIXELS = 16
"""Smallest object, in source pixels (smaller regions are noise)."""
PAD = 6
"""Source pixels of context around an object's box in its cut-out (the world's ``ZOOM_PAD``)."""
ROW_GAP = 8
"""Objects whose centres lie fewer source pixels apart vertically share a row of the reading order."""
MAX_OBJECTS = 10
"""Most objects one call shows (each is one image of the model's context)."""


class Found(NamedTuple):
    """One object of a crop: its bounding box in source pixels (``x0, y0, x1, y1``, ends exclusive) and
    its pixel count."""

    box: tuple[int, int, int, int]
    pixels: int


def find_objects(
    crop: np.ndarray, offset: tuple[int, int] = (0, 0), max_pixels: float | None = None
) -> list[Found]:
    """The objects of ``crop`` (``(h, w, 3)`` uint8), in reading order (module docstring), none larger than
    ``max_pixels`` when given; boxes moved by ``offset`` (the crop's top-left ``(x, y)`` in the source)."""
    import cv2

    h, w = crop.shape[:2]
    background = np.median(crop.reshape(-1, crop.shape[2]), axis=0)  # (3,)
    diff = np.abs(crop.astype(np.int16) - background.astype(np.int16)).max(axis=2)  # (h, w)
    mask = (diff > CONTRAST).astype(np.uint8)
    _, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)  # (n, 5): x, y, w, h, area
    x, y, bw, bh, area = stats[1:].T  # (n - 1,) each; row 0 is the background
    limit = np.inf if max_pixels is None else max_pixels
    keep = (x > 0) & (y > 0) & (x + bw < w) & (y + bh < h) & (area >= MIN_PIXELS) & (area <= limit)
    found = [Found((int(a), int(b), int(a + c), int(b + d)), int(n)) for a, b, c, d, n in stats[1:][keep]]
    found = sorted(found, key=lambda f: -f.pixels)[:MAX_OBJECTS]  # the largest, when there are too many
    ox, oy = offset
    found = [Found((f.box[0] + ox, f.box[1] + oy, f.box[2] + ox, f.box[3] + oy), f.pixels) for f in found]
    return reading_order(found)


def reading_order(found: list[Found]) -> list[Found]:
    """``found`` row by row (centres less than :data:`ROW_GAP` apart vertically share a row), top to
    bottom, each row left to right."""
    by_y = sorted(found, key=lambda f: (f.box[1] + f.box[3], f.box[0] + f.box[2]))
    rows: list[list[Found]] = []
    for f in by_y:
        cy = (f.box[1] + f.box[3]) / 2
        if rows and cy - (rows[-1][0].box[1] + rows[-1][0].box[3]) / 2 < ROW_GAP:
            rows[-1].append(f)
        else:
            rows.append([f])
    return [f for row in rows for f in sorted(row, key=lambda f: f.box[0] + f.box[2])]


def cutout_box(box: tuple[int, int, int, int], width: int, height: int) -> tuple[int, int, int, int]:
    """The square around ``box`` padded by :data:`PAD`, moved (not cut) to lie in the image where it fits."""
    x0, y0, x1, y1 = box
    side = min(max(x1 - x0, y1 - y0) + 2 * PAD, width, height)
    cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
    x0 = min(max(cx - side // 2, 0), width - side)
    y0 = min(max(cy - side // 2, 0), height - side)
    return x0, y0, x0 + side, y0 + side


def located(
    task: AgentTask, image: int, box: list[float] | None = None, max_size: float | None = None
) -> list[Found]:
    """The objects an ``objects`` call on ``box`` (default: the whole image) of note image ``image`` finds,
    in source pixels."""
    src = task.sources[image - 1]  # (H, W, 3)
    H, W = src.shape[:2]
    x0, y0, x1, y1 = box_pixels(box or WHOLE, W, H)
    limit = None if max_size is None else max_size * (x1 - x0) * (y1 - y0)
    return find_objects(src[y0:y1, x0:x1], (x0, y0), limit)
