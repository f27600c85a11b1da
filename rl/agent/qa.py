"""Scoring the answer to a question from a user's task file (``rl.agent.task_file``; pure).

    score_qa(task, "Red.")          # 1.0 when "red" is one of task.meta["answers"] (match "exact")

Answers are compared after VQA-eval's normalisation (what lmms-eval and VLMEvalKit apply to VQAv2-style
answers, :func:`normalise`): lower case, punctuation removed, number words as digits ("two" -> "2"),
articles dropped. A task's ``match`` is ``"exact"`` (the answer, normalised, equals an accepted answer) or
``"contains"`` (an accepted answer appears in it as whole words: "There are 3 cups." for "3").

A hedge that lists several values ("2 or 3 cups") would pass ``contains``, and GRPO learns to exploit
that, so under ``contains`` the reply must not give a rival value either, outside the accepted answer's
own words (:func:`rival_in`): one of the task's ``choices`` that is not accepted, or, without
``choices``, any other number when every accepted answer is a number, and the other of yes / no when
every accepted answer is yes or no. ``choices: []`` turns the check off. Only the ``<answer>`` block is
read when there is one, and tool calls never are.
"""

from __future__ import annotations

from mm.eval.pope import vqa_process_punctuation
from rl.agent.parse import answer_text
from rl.agent.task import AgentTask

MATCHES = ("exact", "contains")
"""How an answer is compared with the accepted ones (module docstring)."""

NUMBER_WORDS = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
    "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}  # fmt: skip
"""VQA-eval's ``manualMap``: number words read as digits."""
ARTICLES = frozenset({"a", "an", "the"})
"""Words VQA-eval drops."""


def normalise(text: str) -> str:
    """VQA-eval's ``processPunctuation`` then ``processDigitArticle`` (without its contraction table), except
    that an answer of articles alone keeps them: a multiple-choice "(A)" stays "a", not an empty answer."""
    words = vqa_process_punctuation(text.lower().replace("\n", " ").replace("\t", " ").strip()).split()
    words = [w for w in words if w not in ARTICLES] or words
    return " ".join(NUMBER_WORDS.get(w, w) for w in words)


def matches(answer: str, accepted: str, match: str) -> bool:
    """Whether ``answer`` gives ``accepted`` under ``match`` (both normalised here)."""
    a, b = normalise(answer), normalise(accepted)
    if match == "exact":
        return a == b
    if match == "contains":
        return bool(b) and f" {b} " in f" {a} "
    raise ValueError(f"match must be one of {MATCHES}, got {match!r}")


def rival_in(answer: str, accepted: list[str], choices: list[str] | None) -> str | None:
    """The first rival value ``answer`` gives besides the accepted answers' words (module docstring), or
    None; ``choices`` None: the number and yes / no rules."""
    rest = f" {normalise(answer)} "
    ok = sorted({normalise(a) for a in accepted}, key=len, reverse=True)  # "dark red" before "red"
    for a in ok:
        while f" {a} " in rest:
            rest = rest.replace(f" {a} ", " ")
    words = rest.split()
    if choices is not None:
        rivals = [c for c in dict.fromkeys(normalise(c) for c in choices) if c and c not in ok]
        return next((r for r in rivals if f" {r} " in f" {' '.join(words)} "), None)
    if all(a.isdigit() for a in ok):
        return next((w for w in words if w.isdigit()), None)
    if set(ok) <= {"yes", "no"}:
        return next((w for w in words if w in {"yes", "no"}), None)
    return None


def score_qa(task: AgentTask, text: str) -> float:
    """1.0 when ``text`` gives one of the task's accepted answers under its ``match`` (and, under
    ``contains``, no rival value: :func:`rival_in`), else 0.0."""
    reply, accepted, match = answer_text(text), task.meta["answers"], task.meta["match"]
    if not any(matches(reply, a, match) for a in accepted):
        return 0.0
    return float(match == "exact" or rival_in(reply, accepted, task.meta.get("choices")) is None)
