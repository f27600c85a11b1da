"""Scoring the answer to a question from a user's task file (``rl.agent.task_file``; pure).

    score_qa(task, "Red.")          # 1.0 when "red" is one of task.meta["answers"] (match "exact")

Answers are compared after VQA-eval's normalisation (what lmms-eval and VLMEvalKit apply to VQAv2-style
answers, :func:`normalise`): lower case, punctuation removed, number words as digits ("two" -> "2"),
articles dropped. A task's ``match`` is ``"exact"`` (the answer, normalised, equals an accepted answer) or
``"contains"`` (an accepted answer appears in it as whole words: "There are 3 cups." for "3"). Under
``contains`` a hedge that lists several values passes, which GRPO learns to exploit: keep ``exact`` for
the tasks that train. Only the ``<answer>`` block is read when there is one, and tool calls never are.
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


def score_qa(task: AgentTask, text: str) -> float:
    """1.0 when ``text`` gives one of the task's accepted answers under its ``match``, else 0.0."""
    reply = answer_text(text)
    return float(any(matches(reply, a, task.meta["match"]) for a in task.meta["answers"]))
