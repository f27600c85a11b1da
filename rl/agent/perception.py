"""Perception data: single-turn reading of world images, the stage both SFT models start from.

    items = perception_items(WorldTaskConfig(seed=0), notes=400)        # list[AgentTask], train notes only
    turns = {t.task_id: [t.meta["reply"]] for t in items}              # what a scripted policy answers

A 1.2M-parameter policy trained only on tool demonstrations learns a constant answer: 128 detail tasks
are too few to learn to read 8-pixel objects. This stage teaches reading on its own, cheaply: every item
is one image and one question, answered in the demonstrations' format, so the tower, the fusion and the
LM learn to read before either SFT. Items come from the ``train`` notes of the world (never a test
note), each photo giving one item per question below (``views``):

- ``tray``: the crop a tray zoom returns (:func:`rl.agent.world_demos.tray_box`, through the ``zoom``
  tool itself, so it is encoded exactly as a zoom observation is), asked the detail tasks' questions:
  the count of each tiny category, and the colour of each tiny category that appears once.
- ``target``: the crop a target zoom returns (the asked objects' box, padded as detail tasks pad it),
  asked the same questions of the objects in it, and for a single object what it is ("It is a tiny red
  cup.": what a change task's zooms on the changed region must read).
- ``view``: the full photo (as the note shows it), asked the colour of each large object whose category
  appears once among the large ones (legible in the downsampled view; captions name them).

Answers are :func:`rl.agent.world_demos.detail_answer` with ``bare`` as the config's
``data.bare_answers`` ("It is red.", "There are 2."); ``meta["reply"]`` holds it, ``answer`` the value
(so :func:`rl.agent.answers.score_answer` scores a colour or count reading like a detail answer; an
``object`` item's value is "colour category" and :func:`reading_score` scores it). Items are a pure
function of the world config and the arguments.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np

from mm.world import vocab
from mm.world.detail import DetailScene, padded_box
from rl.agent.answers import score_answer, words
from rl.agent.task import AgentTask
from rl.agent.tools import zoom
from rl.agent.world_demos import detail_answer, normalised_box
from rl.agent.world_tasks import TRAY_PAD, WorldTaskConfig, note_split, objects_box, photo, world_note

PERCEPTION_VIEWS = ("tray", "target", "view")
"""What a perception item shows: a tray zoom crop, a target zoom crop, or the full photo."""


def zoom_crop(image: np.ndarray, box: Sequence[int]) -> np.ndarray:
    """The ``zoom`` tool's crop of source-pixel ``box`` (normalised as a demonstration's call is):
    ``(h, w, 3)`` uint8, the array a zoom observation carries."""
    H, W = image.shape[:2]
    holder = AgentTask("crop", "detail", (image,), "", "")
    obs = zoom(holder, 1, normalised_box(list(box), W, H))
    assert obs.image is not None  # zoom always returns its crop
    return obs.image


def _question(ask: str, cat: str, where: str, size: str = "tiny") -> str:
    if ask == "object":
        return f"What is the {size} object {where}?"
    c = vocab.category(cat)
    if ask == "count":
        return f"How many {size} {c.plural} are {where}?"
    return f"What colour is the {size} {cat} {where}?"


def scene_items(
    cfg: WorldTaskConfig, scene: DetailScene, image: np.ndarray, prefix: str, views: Sequence[str], bare: bool
) -> list[AgentTask]:
    """The perception items of one photo (module docstring); ``image`` is its full-resolution render."""
    S = cfg.detail.source_size
    counts = Counter(o.category for o in scene.tiny)
    tray = zoom_crop(image, padded_box(tuple(scene.tray), TRAY_PAD, S)) if "tray" in views else None
    out: list[AgentTask] = []

    def add(view: str, source: np.ndarray, ask: str, cat: str, value: str, size: str = "tiny") -> None:
        where = "on the tray in the photo" if size == "tiny" else "in the photo"
        reply = f"It is a {size} {value}." if ask == "object" else detail_answer(ask, value, cat, bare, size)
        meta = {"view": view, "ask": ask, "object": cat, "reply": reply}
        task_id = f"{prefix}/{view}/{ask}/{cat}"
        out.append(AgentTask(task_id, "detail", (source,), _question(ask, cat, where, size), value, meta))

    for cat in sorted(counts):
        targets = [o for o in scene.tiny if o.category == cat]
        crops = {"tray": tray}
        if "target" in views:
            crops["target"] = zoom_crop(image, objects_box(cfg, targets))
        for view in ("tray", "target"):
            if view not in views:
                continue
            add(view, crops[view], "count", cat, str(counts[cat]))
            if counts[cat] == 1:
                add(view, crops[view], "color", cat, targets[0].color)
        if "target" in views and counts[cat] == 1:
            add("target", crops["target"], "object", cat, f"{targets[0].color} {cat}")
    if "view" in views:
        large = Counter(o.category for o in scene.large)
        for o in scene.large:
            if large[o.category] == 1:
                add("view", image, "color", o.category, o.color, o.size)
    return out


def perception_items(
    cfg: WorldTaskConfig,
    notes: int,
    views: Sequence[str] = PERCEPTION_VIEWS,
    *,
    bare: bool = True,
    start: int = 0,
) -> list[AgentTask]:
    """The items of the first ``notes`` train notes from note ``start`` on (every photo of each)."""
    return list(iter_perception_items(cfg, notes, views, bare=bare, start=start))


def iter_perception_items(
    cfg: WorldTaskConfig, notes: int, views: Sequence[str] = PERCEPTION_VIEWS, *, bare: bool = True,
    start: int = 0,
) -> Iterator[AgentTask]:  # fmt: skip
    """:func:`perception_items`, one note at a time."""
    bad = [v for v in views if v not in PERCEPTION_VIEWS]
    if bad or not views:
        raise ValueError(f"views must be a non-empty subset of {PERCEPTION_VIEWS}, got {list(views)}")
    if notes < 1:
        raise ValueError(f"notes must be >= 1, got {notes}")
    made, index = 0, start
    while made < notes:
        if note_split(cfg, index) == "train":
            note = world_note(cfg, index)
            for k, scene in enumerate(note.scenes):
                image = photo(cfg, note, k)
                yield from scene_items(cfg, scene, image, f"{note.id}/p{k + 1}", views, bare)
            made += 1
        index += 1


def reading_score(item: AgentTask, text: str) -> float:
    """How right ``text`` is for a perception item: detail scoring for colour and count items; for an
    ``object`` item 1 when it names the item's colour and category and no other colour or category."""
    if item.meta["ask"] != "object":
        return score_answer(item, text)
    color, cat = item.answer.split(" ", 1)
    said = " " + " ".join(words(text)) + " "
    colors = {c for c in vocab.COLORS if f" {c} " in said}
    cats = {c.name for c in vocab.CATEGORIES if f" {c.name} " in said}
    return float(colors == {color} and cats == {cat})
