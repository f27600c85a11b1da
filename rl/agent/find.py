"""``find``: the regions of a note image that a model names as the asked thing, each cut out at full
resolution (a built-in tool that is off unless named in ``tool_modules``).

    rl agent --config configs/rl/agent_world.yaml --out runs/f0 \\
        --set 'tool_modules=[rl.agent.find]' data.detail_zoom=find

    <tool>{"name": "find", "image": 2, "object": "the tiny towels"}</tool>
    -> '2 matches for "the tiny towels" in image 2 of 3:' match 1: [img] match 2: [img]
    <tool>{"name": "find", "image": 1, "object": "cup", "box": [0.3, 0.3, 0.7, 0.7]}</tool>
    <tool>{"name": "find", "object": "the tiny towels"}</tool>        # every photo of the note
    -> '3 matches for "the tiny towels" in images 1-3:' match 1 (image 1): [img] match 2 (image 3): ...

A region proposer and a namer, the open-vocabulary detector of a tool-using VLM built from parts this
toolkit already has. The proposer is :mod:`rl.agent.regions` (connected regions that differ from the
box's median colour); without a box it looks at the whole image and keeps regions up to
:data:`SMALL` of its area (small things: a whole-image call is for what the downsampled view cannot
show), with a box at any size. The namer is a model that describes each region's cut-out ("It is a tiny
red towel."); a region matches when its description holds every word of ``object`` but its articles (the
last word also in its plural or singular form: "the tiny towels" matches "a tiny red towel"). The
matches are shown in reading order, each after its label (at most
:data:`rl.agent.regions.MAX_OBJECTS` regions are named); the text says how many there are, and how many
photos the note has ("in image 2 of 3": a policy that looks through every photo knows where to stop).
With the option ``labels`` (``tool_options: {rl.agent.find: {labels: true}}``) each label also says what
the namer said of that region (" match 1: It is a tiny red towel."), as an open-vocabulary detector gives
each box its phrase, and the text counts the things named, in order of first mention, in the call's words
('4 matches for "tiny" in image 1 of 1 (a tiny towel, two tiny cups and a tiny fork):', :func:`tally`); the
default shows the cut-outs alone. With the option ``group`` the matches come grouped by the thing the namer
names (:func:`thing`), groups in order of first mention, reading order within each (:func:`grouped`): the
cut-outs then line up with the tally, the two cups side by side.

In ``rl agent`` the namer is the policy's starting model (``policy.init``, or the note model the run
builds), frozen: the tool sees nothing the policy could not, and never the world's ground truth
(:func:`configure`, called once the start is known). Elsewhere give it one with :func:`set_namer`
(:func:`model_namer` for a model folder). Descriptions are cached by the cut-out's pixels, so a group of
trajectories on one photo names each region once; before a stage rolls out its tasks, :func:`prepare` names
the regions of all their photos ahead, in full batches, shared out over data-parallel ranks.

Importing this module registers the tool in :data:`rl.agent.tools.TOOLS` (``tool_modules``); without it
every other run is unchanged.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl.agent.parse import ParseError
from rl.agent.regions import Found, cutout_box, located
from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS, ZOOM_SCHEMA, Observation, check_box, format_box

SMALL = 0.005
"""Largest region a call without a box considers, as a share of the image's area (a 256-px photo: 327
pixels; the agent world's tiny objects are at most 110, its large ones 520 and more)."""
PROMPT = "Describe the photo."
"""What the model namer is asked of each cut-out (the pipeline's image caption prompt)."""

ARTICLES = frozenset({"a", "an", "the"})
"""Words of a name that a description need not hold ("the tiny cup" matches "It is a tiny red cup.")."""

Namer = Callable[[Sequence[np.ndarray]], list[str]]
"""Describes each ``(h, w, 3)`` uint8 cut-out in words, one text per image."""

FIND_SCHEMA = {
    "type": "object",
    "properties": {
        **ZOOM_SCHEMA["properties"],  # image, box: as zoom takes them
        "object": {"type": "string", "description": 'what to find, e.g. "tiny cup"'},
    },
    "required": ["object"],  # without a box: the whole image, small regions only; without an image: every one
}

OPTIONS = {"labels": bool, "group": bool}
"""This module's ``tool_options`` (:func:`rl.agent.tools.check_tool_options`): ``labels``, each match labelled
with the namer's words; ``group``, matches grouped by the thing named (both default false)."""

_namer: Namer | None = None
_labels = False
_group = False


def set_labels(on: bool) -> bool:
    """Whether each match's label holds the namer's words from now on; returns the setting before."""
    global _labels
    before, _labels = _labels, on
    return before


def set_group(on: bool) -> bool:
    """Whether matches come grouped by the thing named (:func:`grouped`) from now on; returns the setting
    before."""
    global _group
    before, _group = _group, on
    return before


def set_namer(namer: Namer | None) -> Namer | None:
    """Make ``namer`` the one :func:`find` asks; returns the one before (None: none was set)."""
    global _namer
    before, _namer = _namer, namer
    return before


class ModelNamer:
    """A namer from a model folder (a NoteVLM or a supported family, ``load_adapter``): the model's greedy
    answer to :data:`PROMPT` on each cut-out, ``batch_size`` cut-outs a ``generate``. The model loads on the
    first call; answers are cached by the cut-out's pixels (``cache``: digest -> text), so a cut-out is
    named once per process whatever asks for it (:func:`prepare` fills the cache ahead)."""

    def __init__(self, folder: str | Path, *, batch_size: int = 128, max_new_tokens: int = 24) -> None:
        self.folder, self.batch_size, self.max_new_tokens = str(folder), batch_size, max_new_tokens
        self.cache: dict[bytes, str] = {}
        self._backend: Any = None

    @staticmethod
    def key(image: np.ndarray) -> bytes:
        """The cache key of a cut-out: a digest of its pixels and shape."""
        return hashlib.sha1(np.ascontiguousarray(image).tobytes() + str(image.shape).encode()).digest()

    def __call__(self, images: Sequence[np.ndarray]) -> list[str]:
        from rl.agent.backend import Sampling

        keys = [self.key(im) for im in images]
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))  # unique, in order
        if todo:
            first = {k: im for k, im in zip(keys, images)}
            backend = self._loaded()
            for i in range(0, len(todo), self.batch_size):
                batch = todo[i : i + self.batch_size]
                rows = [backend.prompt([first[k]], PROMPT) for k in batch]  # a batch's inputs at a time
                turns = backend.generate(rows, max_new_tokens=self.max_new_tokens, sampling=Sampling())
                self.cache.update((k, t.text) for k, t in zip(batch, turns))
        return [self.cache[k] for k in keys]

    def _loaded(self) -> Any:
        if self._backend is None:
            from mm.model.adapter.load import load_adapter
            from rl.agent.backend import backend_for

            self._backend = backend_for(load_adapter(self.folder))
            self._backend.adapter.model.eval()
        return self._backend


def model_namer(folder: str | Path, *, batch_size: int = 128, max_new_tokens: int = 24) -> ModelNamer:
    """A :class:`ModelNamer` of the model in ``folder``."""
    return ModelNamer(folder, batch_size=batch_size, max_new_tokens=max_new_tokens)


def prepare(tasks: Sequence[AgentTask]) -> None:
    """``rl agent``'s hook before a stage rolls out ``tasks`` (:func:`rl.agent.tools.prepare_tool_modules`):
    every region a call without a box considers, in every photo of the tasks, named ahead in the namer's
    full batches, so find's calls then hit the cache (one call names a photo's few regions, a batch far
    from full). Under data parallel each rank names every world-th task's regions and the names are
    shared, so each region is named once over the ranks. A namer without a cache (a plain callable given
    to :func:`set_namer`) names on demand, as before. Every rank calls it with the same tasks."""
    from rl.agent.parallel import gathered, strided

    namer = _namer
    if not isinstance(namer, ModelNamer):
        return
    before = set(namer.cache)
    crops = {}  # this rank's unnamed cut-outs, each once
    for task in strided(tasks):
        for j in range(1, len(task.sources) + 1):
            for _, crop in regions(task, j):
                key = namer.key(crop)
                if key not in before:
                    crops.setdefault(key, crop)
    namer(list(crops.values()))
    fresh = [(k, v) for k, v in namer.cache.items() if k not in before]
    namer.cache.update(gathered(fresh))


def configure(cfg: Any) -> None:
    """``rl agent``'s hook, once the policy's start is known: the namer is that model (``policy.init``); the
    ``labels`` and ``group`` options from ``tool_options``."""
    from mm.errors import UserError

    if cfg.policy.init is None:
        raise UserError(
            "the find tool names regions with the policy's starting model, and policy.init is not set; "
            "set policy.init=MODEL_FOLDER or note_model.build=true"
        )
    set_namer(model_namer(cfg.policy.init))
    options = cfg.tool_options.get(__name__, {})
    set_labels(options.get("labels", False))
    set_group(options.get("group", False))


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def matches(name: str, text: str) -> bool:
    """True when ``text`` holds every word of ``name`` but its articles, the last also in its plural or
    singular form."""
    from mm.train.tasks import plural

    want, have = [w for w in _words(name) if w not in ARTICLES], set(_words(text))
    if not want:
        return False
    *rest, last = want
    forms = {last, plural(last)} | {w for w in have if plural(w) == last}
    return all(w in have for w in rest) and bool(forms & have)


def thing(said: str) -> str:
    """What a description names: its last word ("It is a tiny red towel." -> "towel"; the namer's prompt
    asks for one short sentence about one thing)."""
    words = re.findall(r"[a-z]+", said.lower())
    return words[-1] if words else ""


def tally(said: Sequence[str], asked: str = "") -> str:
    """The things of ``said`` (:func:`thing`) counted, in order of first mention, each after the words of
    ``asked`` that are not that thing (nor an article): "a tiny towel, two tiny cups and a tiny apple" for
    "tiny", "two cups" for "the cups"."""
    from mm.train.tasks import plural
    from mm.world.text import NUMBERS, article, join_phrases

    counts: dict[str, int] = {}
    for t in map(thing, said):
        counts[t] = counts.get(t, 0) + 1
    parts = []
    for t, n in counts.items():
        words = [w for w in _words(asked) if w not in ARTICLES and w not in (t, plural(t))]
        said_as = " ".join([*words, t if n == 1 else plural(t)])
        head = article(said_as) if n == 1 else NUMBERS[n] if n < len(NUMBERS) else n
        parts.append(f"{head} {said_as}")
    return join_phrases(parts)


def grouped(said: Sequence[str]) -> list[int]:
    """The indices of ``said`` grouped by the thing each names (:func:`thing`), groups in order of first
    mention, each group in its own order: ["a cup", "a fork", "a cup"] -> [0, 2, 1]."""
    first: dict[str, int] = {}
    for t in map(thing, said):
        first.setdefault(t, len(first))
    return sorted(range(len(said)), key=lambda i: first[thing(said[i])])  # stable


def regions(task: AgentTask, image: int, box: list[float] | None = None) -> list[tuple[Found, np.ndarray]]:
    """The regions a ``find`` call on ``box`` of note image ``image`` considers (without a box: the whole
    image, regions up to :data:`SMALL` of it), each with its ``(s, s, 3)`` cut-out, in reading order."""
    src = task.sources[image - 1]  # (H, W, 3)
    H, W = src.shape[:2]
    out = []
    for f in located(task, image, box, None if box is not None else SMALL):
        x0, y0, x1, y1 = cutout_box(f.box, W, H)
        out.append((f, np.ascontiguousarray(src[y0:y1, x0:x1])))
    return out


def find(
    task: AgentTask, image: int | None = None, object: str = "", box: list[float] | None = None
) -> str | Observation:
    """The regions of note image ``image`` (inside ``box``, default the whole image and small regions only;
    no ``image``: every image of the note, whole) that the namer calls ``object``, each cut out at full
    resolution."""
    if _namer is None:
        raise RuntimeError(
            "find has no namer: rl agent uses the policy's starting model; elsewhere call "
            "rl.agent.find.set_namer(rl.agent.find.model_namer(MODEL_FOLDER)) first"
        )
    n = len(task.sources)
    images = [image] if image is not None else list(range(1, n + 1))
    seen = [(j, crop) for j in images for _, crop in regions(task, j, box)]
    names = _namer([crop for _, crop in seen]) if seen else []
    hits = [(j, crop, said) for (j, crop), said in zip(seen, names) if matches(object, said)]
    if _group:
        hits = [hits[i] for i in grouped([said for _, _, said in hits])]
    where = f"in image {image or 1} of {n}" if image is not None or n == 1 else f"in images 1-{n}"
    where += f" at {format_box(box)}" if box is not None else ""
    if not hits:
        return f'no match for "{object}" {where}'
    each = image is None and n > 1  # say which photo each match is in
    labels = tuple(
        f" match {k}{f' (image {j})' if each else ''}:{f' {said.strip()}' if _labels else ''}"
        for k, (j, _, said) in enumerate(hits, 1)
    )
    named = f" ({tally([said for _, _, said in hits], object)})" if _labels else ""
    text = f'{len(hits)} match{"es" if len(hits) != 1 else ""} for "{object}" {where}{named}:'
    crops = [crop for _, crop, _ in hits]
    return Observation(text, crops[0], tuple(crops[1:]), labels)


def _check(args: dict) -> ParseError | None:
    if "box" in args and "image" not in args:
        return ParseError("bad_box", "a box is a box of one image; give its image too, or no box")
    return check_box(args) if "box" in args else None


def register(registry=TOOLS) -> None:
    """Add ``find`` to ``registry`` (the loop's by default); a registry that has it is left as is."""
    if "find" not in registry:
        registry.register(
            "find",
            find,
            FIND_SCHEMA,
            description="cut out each region of an image (default: its small ones; no image: of each) "
            "showing the named thing",
            check=_check,
        )


register()
