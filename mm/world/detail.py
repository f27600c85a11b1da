"""Full-resolution note photos with details that are legible only after zooming (pure: seeds in, arrays out).

A detail photo is ``source_size`` pixels square (4x the tower's ``view_size`` by default). It holds a few
large objects, drawn like the world's objects, and a *tray*: a lighter square where ``tiny`` objects
lie on a 3x3 grid of cells. A tiny object is 7-12 source pixels across (its radius is drawn per object,
so its area does not give its category away); in the ``view_size`` downsample the tower sees it is a
blob of 2-3 pixels whose colour shows but whose category (the shape and glyph of
:mod:`mm.world.vocab`) does not. Which blob is the bucket, and so the bucket's colour and how many
buckets there are, can be read only from a crop of the source: the ``zoom`` tool's job.

Everything is a pure function of seeds: :func:`sample_detail_scene` draws a scene from a NumPy
``Generator``; :func:`render_detail` draws it with clutter and noise from ``pixel_seed``, so two
scenes that differ in one object (:mod:`mm.world.change`) render to photos that differ only there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from mm.data.format import ObjectAnnotation
from mm.world import vocab
from mm.world.render import THEME_BACKGROUND, glyph_mask, object_box, shape_mask
from mm.world.scene import SceneObject

TRAY_GRID = 3
"""The tray is ``TRAY_GRID`` x ``TRAY_GRID`` cells, at most one tiny object per cell."""
TRAY_LIFT = 28
"""The tray is the background made this much lighter (0-255 scale): a mat the tiny objects lie on."""
TRAY_PAD = 2
"""Source pixels added around the tray's box to make the box a tray zoom takes (demonstrations, dialogue
zooms, perception items, exported notes, the legibility reader)."""
_GLYPH_RGB = np.asarray((18, 18, 18), np.uint8)
_SHAPE_OF = {c.name: c.shape for c in vocab.CATEGORIES}
_GLYPH_OF = {c.name: c.glyph for c in vocab.CATEGORIES}


@dataclass(kw_only=True)
class DetailConfig:
    """Knobs of the full-resolution detail photos."""

    source_size: int = 256
    """Side of a full-resolution photo in pixels (what ``zoom`` crops from)."""
    view_size: int = 64
    """Side of the downsample the tower sees (its input size)."""
    large_min: int = 1
    """Fewest large objects in a photo (fewer when a drawn one finds no room off the tray)."""
    large_max: int = 3
    """Most large objects in a photo."""
    tiny_min: int = 3
    """Fewest tiny objects on the tray."""
    tiny_max: int = 5
    """Most tiny objects on the tray (at most ``TRAY_GRID ** 2``)."""
    tiny_radius_min: float = 3.5
    """Smallest half-extent of a tiny object, in source pixels."""
    tiny_radius_max: float = 6.0
    """Largest half-extent of a tiny object, in source pixels (drawn uniformly per object)."""
    tiny_duplicate: float = 0.35
    """Probability that a tiny object repeats a category already on the tray (so counts exceed one)."""
    tray_size: int = 72
    """Side of the tray in source pixels."""
    tray_spots: int = 0
    """Where the tray may lie: 0 = anywhere (4 px from the edges); n >= 2 = at one of n x n spots spread
    evenly over the photo (corners and edges included). A policy says where to zoom by writing the box's
    numbers; with a few spots, finding the tray is choosing one of them, which a small captioning LM
    learns, where reading an arbitrary position off its 64-px view it does not (difficulty knob)."""
    clutter: int = 3
    """Distractor strokes drawn under the objects."""
    noise_std: float = 3.0
    """Std of Gaussian pixel noise of the source, 0-255 scale."""

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(
            64 <= self.source_size <= 1024 and 16 <= self.view_size <= self.source_size,
            f"need 64 <= source_size <= 1024 and 16 <= view_size <= source_size, got "
            f"{self.source_size}, {self.view_size}",
        )
        need(
            1 <= self.large_min <= self.large_max <= 4,
            f"need 1 <= large_min <= large_max <= 4, got {self.large_min}, {self.large_max}",
        )
        need(
            1 <= self.tiny_min <= self.tiny_max <= TRAY_GRID**2,
            f"need 1 <= tiny_min <= tiny_max <= {TRAY_GRID**2}, got {self.tiny_min}, {self.tiny_max}",
        )
        need(
            2.0 <= self.tiny_radius_min <= self.tiny_radius_max <= self.tray_size / TRAY_GRID / 2,
            "need 2 <= tiny_radius_min <= tiny_radius_max <= tray_size / 6 (a tiny object fits its cell), "
            f"got {self.tiny_radius_min}, {self.tiny_radius_max}, tray_size {self.tray_size}",
        )
        need(
            3 * TRAY_GRID <= self.tray_size <= self.source_size // 2,
            f"tray_size must be in [{3 * TRAY_GRID}, source_size / 2], got {self.tray_size}",
        )
        need(
            self.tray_spots == 0 or 2 <= self.tray_spots <= 8,
            f"tray_spots must be 0 (anywhere) or in [2, 8], got {self.tray_spots}",
        )
        need(
            0.0 <= self.tiny_duplicate <= 1.0, f"tiny_duplicate must be in [0, 1], got {self.tiny_duplicate}"
        )
        need(self.clutter >= 0 and self.noise_std >= 0, "clutter and noise_std must be >= 0")

    @property
    def scale(self) -> float:
        """Source pixels per view pixel."""
        return self.source_size / self.view_size


@dataclass(frozen=True)
class DetailScene:
    """One photo's content: large objects, the tray, and the tiny objects on it (drawn last)."""

    theme: str
    """The note's theme (background tint, categories)."""
    large: tuple[SceneObject, ...]
    """Large objects in drawing order."""
    tray: tuple[int, int, int, int]
    """Tray box ``(x0, y0, x1, y1)`` in source pixels, ends exclusive."""
    tiny: tuple[SceneObject, ...]
    """Tiny objects (``size`` "small"), one per tray cell."""
    cells: tuple[int, ...]
    """Tray cell of each tiny object, ``row * TRAY_GRID + col``, aligned with ``tiny``."""

    def objects(self) -> list[SceneObject]:
        """Every object in drawing order."""
        return [*self.large, *self.tiny]


def cell_centre(tray: tuple[int, int, int, int], cell: int) -> tuple[float, float]:
    """Centre of tray cell ``cell`` in source pixels."""
    side = (tray[2] - tray[0]) / TRAY_GRID
    row, col = divmod(cell, TRAY_GRID)
    return tray[0] + (col + 0.5) * side - 0.5, tray[1] + (row + 0.5) * side - 0.5


def tiny_object(
    cfg: DetailConfig, tray: tuple[int, int, int, int], cell: int, category: str, color: str,
    rng: np.random.Generator,
) -> SceneObject:  # fmt: skip
    """A tiny object of ``category`` in ``color`` in tray cell ``cell`` (radius and jitter from ``rng``)."""
    r = float(rng.uniform(cfg.tiny_radius_min, cfg.tiny_radius_max))
    slack = max(0.0, (cfg.tray_size / TRAY_GRID) / 2 - r - 1.0)
    cx, cy = cell_centre(tray, cell)
    dx, dy = rng.uniform(-slack, slack, size=2) * 0.5
    return SceneObject(
        category=category, color=color, size="small", cx=cx + float(dx), cy=cy + float(dy), r=r
    )


def _overlaps(box: tuple[float, float, float, float], other: tuple[float, float, float, float]) -> bool:
    return box[0] < other[2] and other[0] < box[2] and box[1] < other[3] and other[1] < box[3]


def sample_detail_scene(cfg: DetailConfig, theme: str, rng: np.random.Generator) -> DetailScene:
    """A photo of ``theme``: the tray at a random spot, large objects around it, tiny objects on it."""
    S, T = cfg.source_size, cfg.tray_size
    if cfg.tray_spots:
        spots = np.linspace(4, S - T - 4, cfg.tray_spots).round().astype(int)  # (n,) corners of the spots
        tx, ty = (int(spots[i]) for i in rng.integers(cfg.tray_spots, size=2))
    else:
        tx, ty = (int(v) for v in rng.integers(4, S - T - 4, size=2))
    tray = (tx, ty, tx + T, ty + T)
    in_theme = vocab.categories_of_theme(theme)
    colors = vocab.COLORS
    n_large = int(rng.integers(cfg.large_min, cfg.large_max + 1))
    large: list[SceneObject] = []
    for _ in range(n_large):
        size = ("medium", "large")[int(rng.integers(2))]
        r = (0.10 if size == "medium" else 0.13) * S
        cat = in_theme[int(rng.integers(len(in_theme)))]
        color = colors[int(rng.integers(len(colors)))]
        for _ in range(40):  # rejection: off the tray (with a margin) and apart from the others
            cx, cy = rng.uniform(r, S - 1 - r, size=2)
            box = (cx - r - 4, cy - r - 4, cx + r + 4, cy + r + 4)
            if not _overlaps(box, tray) and all(math.hypot(cx - o.cx, cy - o.cy) > r + o.r for o in large):
                large.append(
                    SceneObject(category=cat, color=color, size=size, cx=float(cx), cy=float(cy), r=r)
                )
                break
    n_tiny = int(rng.integers(cfg.tiny_min, cfg.tiny_max + 1))
    big = {o.category for o in large}
    pool = [c for c in in_theme if c not in big] or list(in_theme)
    cats: list[str] = []
    for _ in range(n_tiny):
        fresh = [c for c in pool if c not in cats]
        if cats and (not fresh or rng.random() < cfg.tiny_duplicate):
            cats.append(cats[int(rng.integers(len(cats)))])
        else:
            cats.append(fresh[int(rng.integers(len(fresh)))])
    cells = sorted(int(c) for c in rng.choice(TRAY_GRID**2, size=n_tiny, replace=False))
    tiny = tuple(
        tiny_object(cfg, tray, cell, cat, colors[int(rng.integers(len(colors)))], rng)
        for cell, cat in zip(cells, cats)
    )
    return DetailScene(theme=theme, large=tuple(large), tray=tray, tiny=tiny, cells=tuple(cells))


def _draw(img: np.ndarray, o: SceneObject) -> None:
    """Draw ``o`` into ``img`` in place (its colour, the glyph cut in near-black)."""
    S = img.shape[0]
    x0, y0, x1, y1 = object_box(o, S)
    hw, shp, gly = (y1 - y0, x1 - x0), _SHAPE_OF[o.category], _GLYPH_OF[o.category]
    sm = shape_mask(shp, o.cx - x0, o.cy - y0, o.r, hw)  # (h, w) bool
    crop = img[y0:y1, x0:x1]  # (h, w, 3) view
    crop[sm] = np.asarray(vocab.COLOR_RGB[o.color], np.uint8)
    if gly != "solid":
        crop[glyph_mask(gly, shp, o.cx - x0, o.cy - y0, o.r, hw) & sm] = _GLYPH_RGB


def render_detail(cfg: DetailConfig, scene: DetailScene, pixel_seed: list[int]) -> np.ndarray:
    """The ``(source_size, source_size, 3)`` uint8 RGB photo of ``scene``.

    Clutter and noise come from ``default_rng(pixel_seed)`` only, so scenes rendered with the same
    ``pixel_seed`` differ exactly where their objects differ.
    """
    S = cfg.source_size
    rng = np.random.default_rng(pixel_seed)
    img = np.tile(np.asarray(THEME_BACKGROUND[scene.theme], np.uint8), (S, S, 1))  # (S, S, 3)
    u = rng.random((cfg.clutter, 5))  # (C, 5): x0, y0, dx, dy, grey
    for x, y, dx, dy, g in u.tolist():
        a = (int(x * S), int(y * S))
        b = (a[0] + int((dx - 0.5) * 0.6 * S), a[1] + int((dy - 0.5) * 0.6 * S))
        cv2.line(img, a, b, (round(60 + 90 * g),) * 3, max(1, S // 64))
    x0, y0, x1, y1 = scene.tray
    img[y0:y1, x0:x1] = np.minimum(np.asarray(THEME_BACKGROUND[scene.theme]) + TRAY_LIFT, 255).astype(
        np.uint8
    )
    for o in scene.objects():
        _draw(img, o)
    noise = rng.standard_normal((S, S, 3), dtype=np.float32)  # (S, S, 3)
    if cfg.noise_std > 0:
        img = np.clip(img + noise * np.float32(cfg.noise_std), 0, 255).round().astype(np.uint8)
    return img


def annotations(
    cfg: DetailConfig, scene: DetailScene
) -> tuple[list[ObjectAnnotation], list[ObjectAnnotation]]:
    """``(large, tiny)`` annotations with source-pixel boxes (tiny objects never overlap anything)."""
    S = cfg.source_size

    def ann(o: SceneObject) -> ObjectAnnotation:
        return ObjectAnnotation(category=o.category, bbox=object_box(o, S), color=o.color, size=o.size)

    return [ann(o) for o in scene.large], [ann(o) for o in scene.tiny]


def downsample(image: np.ndarray, size: int) -> np.ndarray:
    """``image`` resized to ``(size, size, 3)`` by area averaging (what the tower sees of a source)."""
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) image, got shape {image.shape}")
    return cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)


def crop(image: np.ndarray, box: tuple[int, int, int, int], size: int) -> np.ndarray:
    """The ``(x0, y0, x1, y1)`` box of ``image`` (ends exclusive, clipped to it) resized to ``size``."""
    H, W = image.shape[:2]
    x0, y0 = max(0, int(box[0])), max(0, int(box[1]))
    x1, y1 = min(W, int(box[2])), min(H, int(box[3]))
    if x1 <= x0 or y1 <= y0:
        raise ValueError(f"box {tuple(box)} holds no pixel of a {W}x{H} image")
    part = image[y0:y1, x0:x1]
    interp = cv2.INTER_AREA if max(part.shape[:2]) > size else cv2.INTER_LINEAR
    return cv2.resize(part, (size, size), interpolation=interp)


def padded_box(box: tuple[float, float, float, float], pad: int, size: int) -> tuple[int, int, int, int]:
    """``box`` grown by ``pad`` pixels on each side, made square and clipped to a ``size`` image."""
    x0, y0, x1, y1 = box
    side = max(x1 - x0, y1 - y0) + 2 * pad
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    nx0 = int(round(min(max(0.0, cx - side / 2), max(0.0, size - side))))
    ny0 = int(round(min(max(0.0, cy - side / 2), max(0.0, size - side))))
    return nx0, ny0, int(min(size, nx0 + side)), int(min(size, ny0 + side))
