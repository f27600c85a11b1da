"""Reading and scoring the agent's answers to world tasks (pure: text in, a score in [0, 1] out).

``score_answer(task, text)`` dispatches on ``task.kind``:

- ``detail``: the asked colour or count. 1 for the right value alone; a hedge that lists ``k`` values
  including the right one gets ``1 / k``; a wrong or missing value 0, and so does an answer that names
  objects but not the asked one ("the tiny fork is red" when asked about the cup).
- ``change``: 0.4 for the kind of change (added / removed / recoloured / moved, by keyword), 0.4 for
  the object (divided by the number of distinct objects named), 0.2 for the colour (for a recolour the
  overlap of the colours named with {old, new}; else the object's colour, divided by the number of
  colours named).
- ``caption``: the F1 of the caption's claims (:mod:`mm.eval.claims`): precision = claims that hold /
  judged claims (1 when none is judged), recall = true facts covered / true facts, over the exists,
  attribute and count kinds. :func:`caption_units` gives the per-kind counts for hallucination rates.
- ``qa`` (tasks from users' files): 1 when the answer gives one of the accepted answers
  (:func:`rl.agent.qa.score_qa`).
- ``dialogue``: the final answer against the hidden goal: half for the count, half for the colours
  (Jaccard overlap of the colour sets); 0 when it names objects but not the goal's.

Text inside ``<tool>...</tool>`` is ignored; when an ``<answer>...</answer>`` block is present, only it
is read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from mm.eval.chair import Vocabulary
from mm.eval.claims import RuleExtractor
from mm.eval.claims.generative import score_caption
from mm.eval.claims.truth import NoteTruth, image_truth
from mm.world import vocab
from rl.agent.parse import answer_text
from rl.agent.qa import score_qa
from rl.agent.task import AgentTask

NUMBER_WORDS: dict[str, int] = {
    w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())
}
"""Number words read as counts (digits are read too)."""

CHANGE_WORDS: dict[str, tuple[str, ...]] = {
    "added": ("added", "appeared", "appears", "addition"),
    "removed": ("removed", "disappeared", "vanished", "missing", "gone"),
    "recoloured": ("recoloured", "recolored", "recolouring", "recoloring", "repainted"),
    "moved": ("moved", "shifted", "relocated", "moves"),
}
"""Verbs of each change kind: the first one in the answer names the kind."""
WEAK_CHANGE_WORDS: dict[str, tuple[str, ...]] = {
    "recoloured": ("colour", "color", "turned"),
    "moved": ("position", "place"),
    "added": ("new",),
    "removed": ("taken",),
}
"""Looser words, read only when the answer has none of :data:`CHANGE_WORDS` ("it has a new colour")."""

CHANGE_WEIGHTS = {"kind": 0.4, "object": 0.4, "color": 0.2}
"""How a change answer's score splits between its parts."""

_WORD = re.compile(r"[a-z0-9]+")
_NOT_COUNTS = re.compile(
    r"\b(?:photo|image|picture|img)s?\s*(?:#\s*)?(?:\d+|" + "|".join(NUMBER_WORDS) + r")\b|\[[^\]]*\]", re.I
)


def words(text: str) -> list[str]:
    """Lower-case words of ``text``."""
    return _WORD.findall(text.lower())


def colors_in(text: str) -> list[str]:
    """World colours named in ``text``, in order, without repeats."""
    palette = set(vocab.COLORS)
    return list(dict.fromkeys(w for w in words(text) if w in palette))


def numbers_in(text: str) -> list[int]:
    """Counts named in ``text`` (digits and number words), in order, without repeats ("a"/"an" is not
    a count; image numbers such as "photo 2" and bracketed boxes are not counts)."""
    out = []
    for w in words(_NOT_COUNTS.sub(" ", text)):
        if w.isdigit():
            out.append(int(w))
        elif w in NUMBER_WORDS:
            out.append(NUMBER_WORDS[w])
    return list(dict.fromkeys(out))


def objects_in(text: str) -> list[str]:
    """Canonical world categories named in ``text``, without repeats."""
    return list(dict.fromkeys(vocab.find_mentions(text)))


def change_kind_in(text: str) -> str | None:
    """The change kind ``text`` names: the first verb of :data:`CHANGE_WORDS` in it, else the first kind
    of :data:`WEAK_CHANGE_WORDS` (in that table's order) with a word in it, else None."""
    said = words(text)
    lookup = {w: k for k, ws in CHANGE_WORDS.items() for w in ws}
    for w in said:
        if w in lookup:
            return lookup[w]
    return next((k for k, ws in WEAK_CHANGE_WORDS.items() if set(ws) & set(said)), None)


def hedge_score(said: Sequence[Any], truth: Any) -> float:
    """1 / len(said) when ``truth`` is among the values said, else 0."""
    return 1.0 / len(said) if truth in said else 0.0


def jaccard(said: Sequence[str], truth: Sequence[str]) -> float:
    """|said & truth| / |said | truth| (1 when both are empty)."""
    a, b = set(said), set(truth)
    return 1.0 if not (a | b) else len(a & b) / len(a | b)


def names_another(text: str, obj: str) -> bool:
    """True when ``text`` names world objects but not ``obj`` (an answer about the wrong object)."""
    named = objects_in(text)
    return bool(named) and obj not in named


def score_detail(task: AgentTask, text: str) -> float:
    t = answer_text(text)
    if names_another(t, task.meta["object"]):
        return 0.0
    if task.meta["ask"] == "color":
        return hedge_score(colors_in(t), task.answer)
    return hedge_score(numbers_in(t), int(task.answer))


def score_change(task: AgentTask, text: str) -> float:
    t = answer_text(text)
    m = task.meta
    kind = float(change_kind_in(t) == m["change"])
    obj = hedge_score(objects_in(t), m["object"])
    said = colors_in(t)
    if m["change"] == "recoloured":
        color = jaccard(said, [m["color"], m["new_color"]])
    else:
        color = hedge_score(said, m["color"])
    w = CHANGE_WEIGHTS
    return w["kind"] * kind + w["object"] * obj + w["color"] * color


def goal_scores(goal: dict[str, Any], text: str) -> dict[str, float]:
    """Per slot of a dialogue goal (``count``, ``colors``), how well ``text`` states it."""
    t = answer_text(text)
    if names_another(t, goal["object"]):
        return {"count": 0.0, "colors": 0.0}
    return {
        "count": hedge_score(numbers_in(t), goal["count"]),
        "colors": jaccard(colors_in(t), goal["colors"]) if colors_in(t) else 0.0,
    }


def score_dialogue(task: AgentTask, text: str) -> float:
    s = goal_scores(task.meta["goal"], text)
    return 0.5 * s["count"] + 0.5 * s["colors"]


@cache
def _extractor() -> RuleExtractor:
    return RuleExtractor(Vocabulary.world())


def caption_truth(task: AgentTask) -> NoteTruth:
    """The truth a caption task is judged against: ``meta["objects"]``, per image ``[(name, colour)]``."""
    vocab_ = _extractor().vocabulary
    return NoteTruth(images=tuple(image_truth(objs, vocab_, set()) for objs in task.meta["objects"]))


def caption_units(task: AgentTask, text: str) -> dict[str, dict[str, int]]:
    """Per claim kind: judged, hallucinated, facts and covered counts of a caption
    (:func:`mm.eval.claims.generative.score_caption`)."""
    return score_caption(answer_text(text), caption_truth(task), _extractor())["units"]


def score_caption_task(task: AgentTask, text: str) -> float:
    units = caption_units(task, text).values()
    judged = sum(u["judged"] for u in units)
    wrong = sum(u["hallucinated"] for u in units)
    facts, covered = sum(u["facts"] for u in units), sum(u["covered"] for u in units)
    precision = 1.0 if judged == 0 else (judged - wrong) / judged
    recall = 0.0 if facts == 0 else covered / facts
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


_SCORERS = {
    "detail": score_detail,
    "change": score_change,
    "caption": score_caption_task,
    "dialogue": score_dialogue,
    "qa": score_qa,
}


def score_answer(task: AgentTask, text: str) -> float:
    """How right ``text`` is as the answer to ``task``, in [0, 1] (module docstring)."""
    if task.kind not in _SCORERS:
        raise ValueError(
            f"task {task.task_id!r}: no scorer for kind {task.kind!r}; known: {sorted(_SCORERS)}"
        )
    return float(_SCORERS[task.kind](task, text))
