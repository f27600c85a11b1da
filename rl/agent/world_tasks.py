"""World tasks that need the agent's tools, built from the full-resolution detail photos of the world.

    cfg = WorldTaskConfig(seed=0)
    tasks = list(world_tasks(cfg, "detail", "train", 100))   # AgentTask objects
    mix = list(mixed_tasks(cfg, "train", 400))                 # every kind in turn
    score_answer(tasks[0], "The tiny cup is red.")            # rl.agent.answers

A *note* ``index`` (``world_note``) is a theme and 1-3 detail photos (:mod:`mm.world.detail`), a pure
function of ``(cfg.seed, index)``; its split (``train`` or ``test``) is drawn from its own stream, so the
tasks of one note, of every kind, are all in one split: train and test tasks never share a note. Each
kind makes one task from a note:

- ``detail``: "What colour is the tiny X on the tray in photo k?" (X once among photo k's tiny objects)
  or "How many tiny Xs ...?" (X drawn by count value first, so answers are not mostly "1");
  ``meta["box"]`` is where to zoom (the object, or all the Xs, padded).
- ``change``: photo 1 and photo 2 are the note's first photo before and after one tiny object was added,
  removed, recoloured or moved (:mod:`mm.world.change`); same clutter and noise, so they differ only in
  ``meta["box"]``. The answer is one sentence ("the tiny cup was recoloured from red to blue").
- ``caption``: "Describe the photo ..." of one photo; scored for attribute/count hallucination and
  coverage against ``meta["objects"]``; ``answer`` is a reference caption from the ground truth.
- ``dialogue``: a hidden goal for the user simulator (:mod:`rl.agent.simulator`): the count and colours
  of the tiny Xs across the note's photos; ``question`` is the simulator's opening line for seed 0.

Boxes are ``[x0, y0, x1, y1]`` in full-resolution source pixels, ends exclusive; image numbers are 1-based.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from mm.world import vocab
from mm.world.change import edit_scene, possible_kinds
from mm.world.detail import (
    TRAY_PAD,
    DetailConfig,
    DetailScene,
    padded_box,
    render_detail,
    sample_detail_scene,
)
from mm.world.render import object_box
from mm.world.text import NUMBERS, article, join_phrases
from rl.agent.simulator import UserSimulator
from rl.agent.task import KINDS, AgentTask

SPLITS = ("train", "test")
"""Note splits."""
ZOOM_PAD = 6
"""Source pixels added around an object's box to make the box a zoom should take."""


@dataclass(kw_only=True)
class WorldTaskConfig:
    """How world tasks are drawn."""

    seed: int = 0
    """World seed: note ``i`` is a pure function of ``(seed, i)``."""
    photos_min: int = 1
    """Fewest photos in a note."""
    photos_max: int = 3
    """Most photos in a note (a change task always shows two: before and after)."""
    test_fraction: float = 0.2
    """Fraction of notes in the held-out ``test`` split."""
    count_prob: float = 0.5
    """Probability that a detail task asks a count rather than a colour."""
    detail: DetailConfig = field(default_factory=DetailConfig)
    """The full-resolution photos."""

    def __post_init__(self) -> None:
        if not 1 <= self.photos_min <= self.photos_max <= 4:
            raise ValueError(
                f"need 1 <= photos_min <= photos_max <= 4, got {self.photos_min}, {self.photos_max}"
            )
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(
                f"test_fraction must be in (0, 1) so both splits have notes, got {self.test_fraction}"
            )
        if not 0.0 <= self.count_prob <= 1.0:
            raise ValueError(f"count_prob must be in [0, 1], got {self.count_prob}")


@dataclass(frozen=True)
class WorldNote:
    """One note of the task world: scenes, and how to render them."""

    id: str
    """Note id, ``aw<seed>-<index>``."""
    index: int
    """Note index."""
    split: str
    """``train`` or ``test``."""
    theme: str
    """The note's theme."""
    scenes: tuple[DetailScene, ...]
    """One scene per photo."""


def note_split(cfg: WorldTaskConfig, index: int) -> str:
    """Split of note ``index`` (its own random stream: independent of what the note holds)."""
    return "test" if np.random.default_rng([cfg.seed, index, 7]).random() < cfg.test_fraction else "train"


def world_note(cfg: WorldTaskConfig, index: int) -> WorldNote:
    """Note ``index`` (scenes only; :func:`photo` renders them)."""
    rng = np.random.default_rng([cfg.seed, index])
    theme = vocab.THEMES[int(rng.integers(len(vocab.THEMES)))]
    n = int(rng.integers(cfg.photos_min, cfg.photos_max + 1))
    scenes = tuple(sample_detail_scene(cfg.detail, theme, rng) for _ in range(n))
    return WorldNote(f"aw{cfg.seed}-{index:06d}", index, note_split(cfg, index), theme, scenes)


def photo(cfg: WorldTaskConfig, note: WorldNote, k: int, scene: DetailScene | None = None) -> np.ndarray:
    """Photo ``k`` (0-based) of ``note`` at full resolution; ``scene`` replaces its scene (same pixels
    elsewhere: clutter and noise depend on ``(seed, index, k)`` only)."""
    return render_detail(cfg.detail, scene or note.scenes[k], [cfg.seed, note.index, k, 1])


def scene_objects(scene: DetailScene) -> list[tuple[str, str]]:
    """``(category, colour)`` of every object of a scene (caption truth)."""
    return [(o.category, o.color) for o in scene.objects()]


def objects_box(cfg: WorldTaskConfig, objs) -> list[int]:
    S = cfg.detail.source_size
    boxes = [object_box(o, S) for o in objs]
    union = (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )
    return list(padded_box(union, ZOOM_PAD, S))


def _photo_name(k: int, n: int) -> str:
    return "the photo" if n == 1 else f"photo {k + 1}"


def pick_by_count(counts: Counter, rng: np.random.Generator) -> str:
    """A category of ``counts``: first a count value uniformly among those present, then a category with
    it (so answers are not mostly "1", which a model could guess without looking)."""
    values = sorted(set(counts.values()))
    n = values[int(rng.integers(len(values)))]
    cats = sorted(c for c, k in counts.items() if k == n)
    return cats[int(rng.integers(len(cats)))]


def detail_task(cfg: WorldTaskConfig, note: WorldNote) -> AgentTask:
    rng = np.random.default_rng([cfg.seed, note.index, 11])
    k = int(rng.integers(len(note.scenes)))
    scene = note.scenes[k]
    counts = Counter(o.category for o in scene.tiny)
    singles = sorted(c for c, n in counts.items() if n == 1)
    where = _photo_name(k, len(note.scenes))
    if not singles or rng.random() < cfg.count_prob:
        cat = pick_by_count(counts, rng)
        ask, answer = "count", str(counts[cat])
        question = f"How many tiny {vocab.category(cat).plural} are on the tray in {where}?"
    else:
        cat = singles[int(rng.integers(len(singles)))]
        ask, answer = "color", next(o.color for o in scene.tiny if o.category == cat)
        question = f"What colour is the tiny {cat} on the tray in {where}?"
    targets = [o for o in scene.tiny if o.category == cat]
    images = tuple(photo(cfg, note, i) for i in range(len(note.scenes)))
    meta = {
        "note": note.id, "split": note.split, "ask": ask, "object": cat, "image": k + 1,
        "box": objects_box(cfg, targets), "tray": list(scene.tray), "tray_text": tray_sentence(scene),
        "tiny": [[o.category, o.color, o.cx, o.cy] for o in scene.tiny],
    }  # fmt: skip
    return AgentTask(f"{note.id}/detail", "detail", images, question, answer, meta)


def change_task(cfg: WorldTaskConfig, note: WorldNote) -> AgentTask:
    rng = np.random.default_rng([cfg.seed, note.index, 12])
    before = note.scenes[0]
    kinds = possible_kinds(before)
    kind = kinds[int(rng.integers(len(kinds)))]
    after, change = edit_scene(cfg.detail, before, kind, rng)
    images = (photo(cfg, note, 0), photo(cfg, note, 0, after))
    S = cfg.detail.source_size
    pad = {
        name: list(padded_box(b, ZOOM_PAD, S)) if b is not None else None
        for name, b in (("before_box", change.before), ("after_box", change.after))
    }
    meta = {
        "note": note.id, "split": note.split, "change": change.kind, "object": change.category,
        "color": change.color, "new_color": change.new_color,
        "box": list(padded_box(change.box, ZOOM_PAD, S)), **pad, "tray": list(before.tray),
    }  # fmt: skip
    question = "Photo 1 was taken before photo 2. What changed on the tray between them?"
    return AgentTask(f"{note.id}/change", "change", images, question, change.describe(), meta)


def reference_caption(scene: DetailScene) -> str:
    """A true caption of a scene in the world's grammar (every object, colours, counts)."""
    return f"The photo shows {join_phrases(object_groups(scene.large, ''))}. {tray_sentence(scene)}"


def tray_sentence(scene: DetailScene) -> str:
    """What lies on the scene's tray, in the world's grammar: "On the tray are two tiny cups (red and
    blue) and a tiny green shell." (the second sentence of :func:`reference_caption`)."""
    verb = "is" if len(scene.tiny) == 1 else "are"
    return f"On the tray {verb} {join_phrases(object_groups(scene.tiny, 'tiny '))}."


def object_groups(objs, size: str) -> list[str]:
    """Objects grouped by category: "a large red cup", "two tiny cups (red and blue)"."""
    by_cat: dict[str, list] = {}
    for o in objs:
        by_cat.setdefault(o.category, []).append(o)
    out = []
    for cat, group in by_cat.items():
        if len(group) == 1:
            word = size or f"{group[0].size} "
            out.append(f"{article(word)} {word}{group[0].color} {cat}")
        else:
            cols = " and ".join(dict.fromkeys(o.color for o in group))
            out.append(f"{NUMBERS[len(group)]} {size}{vocab.category(cat).plural} ({cols})")
    return out


def caption_task(cfg: WorldTaskConfig, note: WorldNote) -> AgentTask:
    rng = np.random.default_rng([cfg.seed, note.index, 13])
    k = int(rng.integers(len(note.scenes)))
    scene = note.scenes[k]
    question = (
        "Describe this photo in detail: name every object, large ones and the tiny ones on the tray, "
        "with its colour, and say how many there are of each."
    )
    meta = {
        "note": note.id, "split": note.split, "image": 1, "photo": k + 1, "objects": [scene_objects(scene)],
        "box": objects_box(cfg, scene.tiny), "tray": list(scene.tray),
    }  # fmt: skip
    return AgentTask(
        f"{note.id}/caption", "caption", (photo(cfg, note, k),), question, reference_caption(scene), meta
    )


def dialogue_goal(note: WorldNote, rng: np.random.Generator) -> dict:
    """The hidden goal: a tiny category of the note, its count across photos, its colours."""
    cat = pick_by_count(Counter(o.category for s in note.scenes for o in s.tiny), rng)
    found = [(k, o) for k, s in enumerate(note.scenes) for o in s.tiny if o.category == cat]
    return {
        "object": cat,
        "count": len(found),
        "colors": sorted({o.color for _, o in found}),
        "images": sorted({k + 1 for k, _ in found}),
    }


def dialogue_task(cfg: WorldTaskConfig, note: WorldNote) -> AgentTask:
    rng = np.random.default_rng([cfg.seed, note.index, 14])
    goal = dialogue_goal(note, rng)
    S = cfg.detail.source_size
    boxes = [[k + 1, list(padded_box(s.tray, TRAY_PAD, S))] for k, s in enumerate(note.scenes)]
    meta = {"note": note.id, "split": note.split, "goal": goal, "zooms": boxes}
    c = vocab.category(goal["object"])
    answer = (
        f"There {'is' if goal['count'] == 1 else 'are'} {goal['count']} tiny "
        f"{c.name if goal['count'] == 1 else c.plural} ({' and '.join(goal['colors'])})."
    )
    images = tuple(photo(cfg, note, i) for i in range(len(note.scenes)))
    task = AgentTask(f"{note.id}/dialogue", "dialogue", images, "", answer, meta)
    opening = UserSimulator(task, seed=0).opening()
    return AgentTask(task.task_id, "dialogue", images, opening, answer, meta)


_MAKERS = {"detail": detail_task, "change": change_task, "caption": caption_task, "dialogue": dialogue_task}


def world_task(cfg: WorldTaskConfig, kind: str, index: int) -> AgentTask:
    """The ``kind`` task of note ``index``."""
    if kind not in _MAKERS:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {KINDS}")
    return _MAKERS[kind](cfg, world_note(cfg, index))


def world_tasks(cfg: WorldTaskConfig, kind: str, split: str, n: int, start: int = 0) -> Iterator[AgentTask]:
    """The first ``n`` ``kind`` tasks of ``split``, from notes ``start, start + 1, ...`` of that split
    (rendered lazily: one task's photos at a time)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if kind not in _MAKERS:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {KINDS}")
    made, index = 0, start
    while made < n:
        if note_split(cfg, index) == split:
            yield world_task(cfg, kind, index)
            made += 1
        index += 1


def mixed_tasks(
    cfg: WorldTaskConfig, split: str, n: int, kinds: tuple[str, ...] = KINDS, start: int = 0
) -> Iterator[AgentTask]:
    """``n`` tasks of ``split`` cycling through ``kinds``, each from its own note (a training mix)."""
    bad = [k for k in kinds if k not in _MAKERS]
    if bad or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    made, index = 0, start
    while made < n:
        if note_split(cfg, index) == split:
            yield world_task(cfg, kinds[made % len(kinds)], index)
            made += 1
        index += 1
