"""Scene sampling (pure: a NumPy ``Generator`` in, plain data out; no pixels).

An image's scene is a list of :class:`SceneObject` in drawing order (later objects cover earlier
ones). Sampling, for one image of a note with theme ``T``:

1. Draw ``n`` in ``[objects_per_image_min, objects_per_image_max]``. With ``anchor_prob`` the first
   object is an anchor of ``T``; the rest come from ``T`` (or, with ``off_theme``, any theme), and
   with ``duplicate_prob`` repeat a category already drawn (so captions carry counts).
2. Co-occurrence: for every anchor in the image, with ``cooccurrence`` its partner is added (if not
   already there), otherwise the partner is removed — so P(partner | anchor) is the knob itself.
   With ``cooccurrence_scope: note`` the draw is made once per note and anchor: the partner is then
   with the anchor in every image of the note or in none, so a note-level caption can hallucinate it
   (with per-image draws a 3-image note almost always shows the partner somewhere).
   A partner added this way is small with ``partner_small`` and, with ``partner_occluded``, slid
   between ``partner_overlap`` and ``partner_overlap_max`` of the way under its anchor and drawn
   before it, so it is partly or (for small partners under large anchors) wholly hidden. A
   captioner cannot always see it, so it learns to name it from the anchor: the prior that makes it
   also name the partner in the images where it is absent. A partner that is not hidden goes, like
   any object, to a free spot (its own cell with ``placement: grid``), or next to its anchor with
   ``partner_spot: anchor``.
   The other way to plant the prior is in the texts (``caption_prior``, :mod:`mm.world.generate`):
   captions that name an absent partner from habit, while the images show it is not there.
3. Positions: other objects are placed by rejection sampling to keep them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from mm.world import vocab
from mm.world.config import WorldConfig

SIZE_RADIUS: dict[str, float] = {"small": 0.095, "medium": 0.13, "large": 0.17}
"""Half-extent of an object as a fraction of the image side, per size (times ``object_scale``)."""


@dataclass(frozen=True)
class SceneObject:
    """One object to draw."""

    category: str
    """Canonical category name."""
    color: str
    """Colour name."""
    size: str
    """Size name."""
    cx: float
    """Centre x in pixels."""
    cy: float
    """Centre y in pixels."""
    r: float
    """Half-extent in pixels."""


@cache
def theme_anchors(theme: str) -> tuple[str, ...]:
    """Anchors whose theme is ``theme``."""
    return tuple(a for a in vocab.ANCHORS if vocab.category(a).theme == theme)


def sample_categories(
    cfg: WorldConfig, theme: str, rng: np.random.Generator, keep: dict[str, bool] | None = None
) -> list[tuple[str, bool]]:
    """Categories of one image as ``(name, is_added_partner)``, before co-occurrence placement.

    ``keep`` (``cooccurrence_scope: note``) holds the note's decision per anchor, drawn the first time
    the anchor appears and reused by the note's later images; None draws afresh for every image.
    """
    in_theme = _categories_of_theme(theme)
    anchors = theme_anchors(theme)
    n = int(rng.integers(cfg.objects_per_image_min, cfg.objects_per_image_max + 1))
    names: list[str] = []
    if anchors and rng.random() < cfg.anchor_prob:
        names.append(anchors[int(rng.integers(len(anchors)))])
    while len(names) < n:
        if names and rng.random() < cfg.duplicate_prob:
            names.append(names[int(rng.integers(len(names)))])
        elif rng.random() < cfg.off_theme:
            names.append(vocab.CATEGORY_NAMES[int(rng.integers(len(vocab.CATEGORY_NAMES)))])
        else:
            names.append(in_theme[int(rng.integers(len(in_theme)))])
    out: list[tuple[str, bool]] = []
    present = set(names)
    removed: set[str] = set()
    added: list[str] = []
    for a in dict.fromkeys(names):  # unique anchors, first-seen order
        p = vocab.PARTNER_OF.get(a)
        if p is None:
            continue
        if keep is None:
            with_partner = rng.random() < cfg.cooccurrence
        else:
            if a not in keep:
                keep[a] = bool(rng.random() < cfg.cooccurrence)
            with_partner = keep[a]
        if with_partner:
            if p not in present:
                added.append(p)
                present.add(p)
        else:
            removed.add(p)
    out = [(c, False) for c in names if c not in removed]
    out += [(p, True) for p in added]
    if not out:  # everything removed (only possible when n == 1 and it was a partner): keep one object
        out = [(names[0], False)]
    return out


_categories_of_theme = cache(vocab.categories_of_theme)


def _fits(cx: float, cy: float, r: float, size: int) -> bool:
    return r <= cx <= size - 1 - r and r <= cy <= size - 1 - r


def sample_scene(
    cfg: WorldConfig, theme: str, rng: np.random.Generator, keep: dict[str, bool] | None = None
) -> list[SceneObject]:
    """One image's objects in drawing order (a hidden partner comes before its anchor); ``keep`` as in
    :func:`sample_categories`."""
    S = cfg.image_size
    cats = sample_categories(cfg, theme, rng, keep)
    placed: list[SceneObject] = []

    def radius(size: str) -> float:
        return SIZE_RADIUS[size] * S * cfg.object_scale

    def color() -> str:
        return vocab.COLORS[int(rng.integers(len(vocab.COLORS)))]

    def free_spot(r: float) -> tuple[float, float]:
        """First of 24 random centres that overlaps nothing placed, else the one with the widest gap."""
        if cfg.placement == "grid":
            cell = cfg.grid_cell
            n = S // cell
            ij = rng.integers(0, n, size=(24, 2))  # (24, 2) cell indices
            jit = rng.uniform(-cfg.grid_jitter, cfg.grid_jitter, size=(24, 2))  # (24, 2)
            cand = np.clip((ij + 0.5) * cell - 0.5 + jit, r, S - 1 - r)  # (24, 2)
        else:
            cand = rng.uniform(r, S - 1 - r, size=(24, 2))  # (24, 2)
        if not placed:
            return float(cand[0, 0]), float(cand[0, 1])
        others = np.array([(o.cx, o.cy, o.r) for o in placed])  # (M, 3)
        dist = np.hypot(
            cand[:, None, 0] - others[None, :, 0], cand[:, None, 1] - others[None, :, 1]
        )  # (24, M)
        gap = (dist - (r + others[None, :, 2])).min(1)  # (24,)
        free = gap >= 0  # (24,)
        k = int(free.argmax()) if free.any() else int(gap.argmax())  # first free candidate, else widest
        return float(cand[k, 0]), float(cand[k, 1])

    for name, is_partner in cats:
        if not is_partner:
            size = vocab.SIZES[int(rng.integers(len(vocab.SIZES)))]
            r = radius(size)
            cx, cy = free_spot(r)
            placed.append(SceneObject(category=name, color=color(), size=size, cx=cx, cy=cy, r=r))
            continue
        anchor_name = next(a for a, p in vocab.PARTNER_PAIRS if p == name)
        anchor_idx = next(i for i, o in enumerate(placed) if o.category == anchor_name)
        anchor = placed[anchor_idx]
        size = "small" if rng.random() < cfg.partner_small else vocab.SIZES[int(rng.integers(1, 3))]
        r = radius(size)
        hidden = rng.random() < cfg.partner_occluded
        overlap = rng.uniform(cfg.partner_overlap, cfg.partner_overlap_max)
        dist = (anchor.r + r) * ((1.0 - overlap) if hidden else 1.1)
        spot = None
        if not hidden and cfg.partner_spot == "cell":  # a visible partner gets a free spot, like any object
            spot = free_spot(r)
        for _ in range(0 if spot else 16):
            ang = rng.uniform(0, 2 * np.pi)
            cx, cy = anchor.cx + dist * np.cos(ang), anchor.cy + dist * np.sin(ang)
            if _fits(cx, cy, r, S):
                spot = (float(cx), float(cy))
                break
        if spot is None:  # no room next to the anchor: place it anywhere, visible
            hidden = False
            spot = free_spot(r)
        obj = SceneObject(category=name, color=color(), size=size, cx=spot[0], cy=spot[1], r=r)
        if hidden:
            placed.insert(anchor_idx, obj)  # drawn before (under) its anchor
        else:
            placed.append(obj)
    return placed
