"""Rendering scenes to RGB images with OpenCV (no file I/O).

Each category is a unique ``shape`` x ``glyph`` pair (:mod:`mm.world.vocab`): the shape is filled
with the object's colour and the glyph (solid / hole / stripe / cross) is cut into it in near-black,
so categories differ by form whatever their colour. Backgrounds are tinted per theme (context, as in
real photos), with distractor strokes (``clutter``) and Gaussian noise (``noise_std``).

``occluded`` of an object is measured exactly from the masks: the fraction of its pixels covered
by objects drawn after it.
"""

from __future__ import annotations

import math
from functools import cache

import cv2
import numpy as np

from mm.data.format import ObjectAnnotation
from mm.world import vocab
from mm.world.scene import SceneObject

THEME_BACKGROUND: dict[str, tuple[int, int, int]] = {
    "kitchen": (112, 100, 86),
    "desk": (92, 96, 108),
    "bathroom": (100, 112, 116),
    "beach": (122, 112, 84),
    "park": (84, 104, 84),
    "street": (96, 96, 96),
}
"""Background RGB per theme (mid greys, far from every object colour)."""

GLYPH_RGB = (18, 18, 18)
"""Colour of the glyph cut into each shape."""

_COLOR_U8 = {k: np.asarray(v, np.uint8) for k, v in vocab.COLOR_RGB.items()}
_GLYPH_U8 = np.asarray(GLYPH_RGB, np.uint8)
NOISE_BANK_SIZE = 128
"""Pixel noise comes from a fixed bank of this many unit-Gaussian fields (x4 flips), for speed."""

_SHAPE_OF = {c.name: c.shape for c in vocab.CATEGORIES}
_GLYPH_OF = {c.name: c.glyph for c in vocab.CATEGORIES}
_SHIFT = 4  # cv2 sub-pixel bits
_ONE = 1 << _SHIFT


@cache
def _background(theme: str, size: int) -> np.ndarray:
    """Flat ``(size, size, 3)`` uint8 background of ``theme`` (copied per image: fast)."""
    return np.tile(np.asarray(THEME_BACKGROUND[theme], np.uint8), (size, size, 1))


@cache
def _noise_bank(size: int) -> np.ndarray:
    """``(NOISE_BANK_SIZE, size, size, 3)`` float32 unit Gaussian noise, fixed seed (same everywhere)."""
    return np.random.default_rng(12345).standard_normal((NOISE_BANK_SIZE, size, size, 3), dtype=np.float32)


def _pts(points: list[tuple[float, float]]) -> np.ndarray:
    # Python's round() is exact round-half-even like NumPy's, and * 16 is exact: same ints, fewer calls
    return np.array([[(round(x * _ONE), round(y * _ONE)) for x, y in points]], np.int32)  # (1, K, 2)


_STAR_UNIT = tuple(
    (rad * math.cos(-math.pi / 2 + k * math.pi / 5), rad * math.sin(-math.pi / 2 + k * math.pi / 5))
    for k, rad in enumerate((1.0, 0.45) * 5)
)  # 10 corners of a unit five-pointed star, outer and inner alternating, from the top


def _star(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    return [(cx + r * dx, cy + r * dy) for dx, dy in _STAR_UNIT]


def _canvas(size: int | tuple[int, int]) -> np.ndarray:
    h, w = (size, size) if isinstance(size, int) else size
    return np.zeros((h, w), np.uint8)


def shape_mask(shape: str, cx: float, cy: float, r: float, size: int | tuple[int, int]) -> np.ndarray:
    """Boolean mask ``(size, size)`` (or ``(h, w)``) of one filled shape centred at ``(cx, cy)``."""
    return _shape_u8(shape, cx, cy, r, size).view(bool)


def _shape_u8(shape: str, cx: float, cy: float, r: float, size: int | tuple[int, int]) -> np.ndarray:
    """:func:`shape_mask` as uint8 0/1 (``.view(bool)`` of it is free, unlike ``astype``)."""
    m = _canvas(size)
    if shape == "circle":
        cv2.circle(m, (round(cx * _ONE), round(cy * _ONE)), round(r * _ONE), 1, -1, cv2.LINE_8, _SHIFT)
        return m
    if shape == "square":
        a = 0.85 * r
        poly = [(cx - a, cy - a), (cx + a, cy - a), (cx + a, cy + a), (cx - a, cy + a)]
    elif shape == "triangle_up":
        poly = [(cx, cy - r), (cx + r, cy + 0.8 * r), (cx - r, cy + 0.8 * r)]
    elif shape == "triangle_down":
        poly = [(cx, cy + r), (cx + r, cy - 0.8 * r), (cx - r, cy - 0.8 * r)]
    elif shape == "diamond":
        poly = [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]
    elif shape == "star":
        poly = _star(cx, cy, r)
    elif shape == "plus":
        a = 0.38 * r
        # 12 corners of a plus, clockwise from the top arm's left edge
        dx = (-a, a, a, r, r, a, a, -a, -a, -r, -r, -a)
        dy = (-r, -r, -a, -a, a, a, r, r, a, a, -a, -a)
        poly = [(cx + x, cy + y) for x, y in zip(dx, dy)]
    elif shape == "bar":
        poly = [
            (cx - r, cy - 0.5 * r),
            (cx + r, cy - 0.5 * r),
            (cx + r, cy + 0.5 * r),
            (cx - r, cy + 0.5 * r),
        ]
    else:
        raise ValueError(f"unknown shape {shape!r}; known shapes: {vocab.SHAPES}")
    cv2.fillPoly(m, _pts(poly), 1, cv2.LINE_8, _SHIFT)
    return m


def glyph_mask(
    glyph: str, shape: str, cx: float, cy: float, r: float, size: int | tuple[int, int]
) -> np.ndarray:
    """Boolean mask of the glyph (before clipping to the shape); ``size`` as in :func:`shape_mask`."""
    return _glyph_u8(glyph, shape, cx, cy, r, size).view(bool)


def _glyph_u8(
    glyph: str, shape: str, cx: float, cy: float, r: float, size: int | tuple[int, int]
) -> np.ndarray:
    """:func:`glyph_mask` as uint8 0/1."""
    m = _canvas(size)
    gy = cy + (0.15 * r if shape == "triangle_up" else -0.15 * r if shape == "triangle_down" else 0.0)
    thick = max(1, round(0.28 * r))
    if glyph == "solid":
        pass
    elif glyph == "hole":
        cv2.circle(
            m,
            (round(cx * _ONE), round(gy * _ONE)),
            round(max(1.2, 0.36 * r) * _ONE),
            1,
            -1,
            cv2.LINE_8,
            _SHIFT,
        )
    elif glyph == "stripe":
        cv2.line(m, (round(cx - r), round(gy)), (round(cx + r), round(gy)), 1, thick)
    elif glyph == "cross":
        a = 0.6 * r
        cv2.line(m, (round(cx - a), round(gy - a)), (round(cx + a), round(gy + a)), 1, thick)
        cv2.line(m, (round(cx - a), round(gy + a)), (round(cx + a), round(gy - a)), 1, thick)
    else:
        raise ValueError(f"unknown glyph {glyph!r}; known glyphs: {vocab.GLYPHS}")
    return m


def object_box(o: SceneObject, size: int) -> tuple[int, int, int, int]:
    """Pixel box ``(x0, y0, x1, y1)`` (exclusive ends) holding the whole shape, clipped to the image."""
    x0, y0 = max(0, math.floor(o.cx - o.r)), max(0, math.floor(o.cy - o.r))
    x1, y1 = min(size, math.ceil(o.cx + o.r) + 1), min(size, math.ceil(o.cy + o.r) + 1)
    return x0, y0, x1, y1


def render_scene(
    objects: list[SceneObject],
    *,
    theme: str,
    size: int,
    clutter: int,
    noise_std: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, list[ObjectAnnotation]]:
    """Draw ``objects`` in order; returns the image ``(size, size, 3)`` uint8 RGB and annotations.

    Annotations come in drawing order with exact ``occluded`` fractions and pixel bboxes of the full
    (unoccluded) shape, ``x1``/``y1`` exclusive.
    """
    img = _background(theme, size).copy()  # (H, W, 3) uint8
    boxes = [object_box(o, size) for o in objects]
    if clutter:
        u = rng.random((clutter, 5))  # (C, 5): x0, y0, dx, dy, grey
        p0 = (u[:, :2] * size).astype(int)
        p1 = p0 + ((u[:, 2:4] - 0.5) * 0.6 * size).astype(int)
        grey = 60.0 + 90.0 * u[:, 4]
        for a, b, g in zip(p0.tolist(), p1.tolist(), grey.tolist()):
            cv2.line(img, a, b, (round(g),) * 3, 1)
    masks = []  # per object: shape mask of its box crop
    for o, (x0, y0, x1, y1) in zip(objects, boxes):
        hw, shp, gly = (y1 - y0, x1 - x0), _SHAPE_OF[o.category], _GLYPH_OF[o.category]
        sm = _shape_u8(shp, o.cx - x0, o.cy - y0, o.r, hw).view(bool)  # (h, w)
        crop = img[y0:y1, x0:x1]  # (h, w, 3) view
        crop[sm] = _COLOR_U8[o.color]
        if gly != "solid":  # a solid glyph draws nothing
            crop[_glyph_u8(gly, shp, o.cx - x0, o.cy - y0, o.r, hw).view(bool) & sm] = _GLYPH_U8
        masks.append(sm)
    if noise_std > 0:
        bank = _noise_bank(size)  # (K, H, W, 3)
        k, flip = int(rng.integers(len(bank))), int(rng.integers(4))
        noise = bank[k, :: (-1 if flip & 1 else 1), :: (-1 if flip & 2 else 1)]
        img = np.clip(img + noise * np.float32(noise_std), 0, 255).round().astype(np.uint8)
    out = img

    anns = []
    covered = np.zeros((size, size), bool)
    for o, m, (x0, y0, x1, y1) in zip(reversed(objects), reversed(masks), reversed(boxes)):
        area = int(np.count_nonzero(m))
        hidden = int(np.count_nonzero(m & covered[y0:y1, x0:x1]))
        covered[y0:y1, x0:x1] |= m
        anns.append(
            ObjectAnnotation(
                category=o.category,
                bbox=(x0, y0, x1, y1),
                color=o.color,
                size=o.size,
                occluded=round(hidden / area, 3) if area else 1.0,
            )
        )
    anns.reverse()
    return out, anns
