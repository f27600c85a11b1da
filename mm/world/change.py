"""Before/after photo pairs: one tiny object of a detail scene added, removed, recoloured or moved.

:func:`edit_scene` returns the edited scene and a :class:`Change` (what changed, and where, in source
pixels). Rendering both scenes with the same ``pixel_seed`` (:func:`mm.world.detail.render_detail`)
gives two photos that differ only inside ``Change.box``, the region an image diff finds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mm.world import vocab
from mm.world.detail import TRAY_GRID, DetailConfig, DetailScene, cell_centre, tiny_object
from mm.world.render import object_box

CHANGE_KINDS: tuple[str, ...] = ("added", "removed", "recoloured", "moved")
"""What an edit does to one tiny object."""

Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class Change:
    """One edit between the before and the after photo."""

    kind: str
    """One of :data:`CHANGE_KINDS`."""
    category: str
    """Canonical category of the edited object."""
    color: str
    """Its colour in the before photo (for ``added``: in the after photo)."""
    new_color: str | None
    """Its colour after a ``recoloured`` edit, else None."""
    before: Box | None
    """Its box in the before photo (None for ``added``), source pixels, ends exclusive."""
    after: Box | None
    """Its box in the after photo (None for ``removed``)."""

    @property
    def box(self) -> Box:
        """The smallest box holding every changed pixel (both boxes for ``moved``)."""
        boxes = [b for b in (self.before, self.after) if b is not None]
        return (
            min(b[0] for b in boxes),
            min(b[1] for b in boxes),
            max(b[2] for b in boxes),
            max(b[3] for b in boxes),
        )

    def describe(self) -> str:
        """The change in one plain sentence ("the tiny red cup was recoloured to blue")."""
        name = f"tiny {self.color} {self.category}"
        if self.kind == "added":
            return f"a {name} was added"
        if self.kind == "removed":
            return f"the {name} was removed"
        if self.kind == "recoloured":
            return f"the tiny {self.category} was recoloured from {self.color} to {self.new_color}"
        return f"the {name} was moved"


def possible_kinds(scene: DetailScene) -> tuple[str, ...]:
    """The edits ``scene`` allows: adding and moving need a free tray cell, the others a tiny object."""
    free = len(scene.cells) < TRAY_GRID**2
    have = bool(scene.tiny)
    return tuple(
        k for k, ok in zip(CHANGE_KINDS, (free, have and len(scene.tiny) > 1, have, have and free)) if ok
    )


def edit_scene(
    cfg: DetailConfig, scene: DetailScene, kind: str, rng: np.random.Generator
) -> tuple[DetailScene, Change]:
    """``scene`` with one tiny object edited as ``kind`` says, and the :class:`Change`."""
    if kind not in possible_kinds(scene):
        raise ValueError(
            f"edit {kind!r} is not possible on this scene ({len(scene.tiny)} tiny objects, "
            f"{TRAY_GRID**2 - len(scene.cells)} free cells); choose one of {possible_kinds(scene)}"
        )
    S = cfg.source_size
    free = [c for c in range(TRAY_GRID**2) if c not in scene.cells]
    tiny, cells = list(scene.tiny), list(scene.cells)
    if kind == "added":
        cell = free[int(rng.integers(len(free)))]
        cats = vocab.categories_of_theme(scene.theme)
        cat = cats[int(rng.integers(len(cats)))]
        color = vocab.COLORS[int(rng.integers(len(vocab.COLORS)))]
        o = tiny_object(cfg, scene.tray, cell, cat, color, rng)
        tiny.append(o)
        cells.append(cell)
        change = Change(kind, cat, color, None, None, object_box(o, S))
    else:
        k = int(rng.integers(len(tiny)))
        o = tiny[k]
        before = object_box(o, S)
        if kind == "removed":
            del tiny[k], cells[k]
            change = Change(kind, o.category, o.color, None, before, None)
        elif kind == "recoloured":
            others = [c for c in vocab.COLORS if c != o.color]
            new = others[int(rng.integers(len(others)))]
            tiny[k] = replace(o, color=new)
            change = Change(kind, o.category, o.color, new, before, before)
        else:  # moved
            cell = free[int(rng.integers(len(free)))]
            cx, cy = cell_centre(scene.tray, cell)
            tiny[k] = replace(o, cx=cx, cy=cy)
            cells[k] = cell
            change = Change(kind, o.category, o.color, None, before, object_box(tiny[k], S))
    order = sorted(range(len(cells)), key=cells.__getitem__)
    edited = replace(scene, tiny=tuple(tiny[i] for i in order), cells=tuple(cells[i] for i in order))
    return edited, change
