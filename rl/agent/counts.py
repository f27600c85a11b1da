"""Counts that quote the tools: a decode-time constraint on answers (``decode.counts`` of ``rl agent``).

    decode: {counts: true}      # a number word in an answer copies a count a tool stated, with its noun

While the policy writes an answer (any turn outside a ``<tool>`` call), a number word ("two" ... "twelve")
opens a *count phrase*: the number word and the words after it must copy one of the count phrases of the
trajectory's tool observations, up to that phrase's end (the next punctuation, "and" or "or"); a number word
that no observation starts a phrase with is not allowed. After ``find``'s tally '(a tiny mouse, two tiny
pencils and a tiny keyboard)' an answer may say "two tiny pencils (orange and white)", never "two tiny
notebooks" or "three tiny pencils"; "a tiny blue mouse" (no number word) and digits ("There are 2.") are
free. The policy still chooses whether to state a count and what follows it.

It is :mod:`rl.agent.quote`'s copy mechanism for answers: a small language model that reads a tally beside
its cut-outs writes the count's shape and takes the nouns from the images (docs/results.md, "Counts that
quote the tools"). As with quotes, the log-probs stay the model's own (the processor edits a copy of the
scores). Numbers the tools never state cannot be claimed, so it suits tools that count (``find`` with its
``labels`` option); without such a tool it only removes number words from the answers.

:func:`count_phrases` lists an observation's phrases, :func:`allows` checks a turn so far, and
:class:`CountProcessor` is the logits processor the agent backend adds to ``generate``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

NUMBER_WORDS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
"""The words that open a count phrase ("a", "an" and "one" state existence as much as a count: free)."""
_NUMBER = re.compile(rf"(?<![A-Za-z0-9-])(?:{'|'.join(NUMBER_WORDS)})(?![A-Za-z0-9-])", re.I)
_PHRASE_END = re.compile(r"[^\w\s'-]|\s(?:and|or)\b", re.I)
_TOOL_OPEN = re.compile(r"<tool>(?!.*</tool>)", re.S)
_TAIL = 160
"""Characters of a turn looked at (a count phrase is shorter)."""


def count_phrases(text: str) -> set[str]:
    """The count phrases of an observation's text, lower case: each number word and the words after it up
    to the next punctuation, "and" or "or" ("two tiny pencils" of "... two tiny pencils and a ...")."""
    out = set()
    for m in _NUMBER.finditer(text):
        rest = text[m.start() :]
        end = _PHRASE_END.search(rest, m.end() - m.start())
        out.add(" ".join(rest[: end.start() if end else len(rest)].split()).lower())
    return out


def _written(turn: str) -> list[str]:
    """Each count phrase of ``turn`` as written so far (from its number word to the turn's end), lower case;
    none inside an open ``<tool>`` call."""
    if _TOOL_OPEN.search(turn):
        return []
    return [turn[m.start() :].lower() for m in _NUMBER.finditer(turn)]


def _ends(written: str, p: str) -> bool:
    """Whether ``written`` is ``p`` followed by a character that ends a word."""
    return (
        written.startswith(p)
        and len(written) > len(p)
        and not (written[len(p)].isalnum() or written[len(p)] == "-")
    )


def allows(turn: str, phrases: set[str]) -> bool:
    """Whether every count phrase of ``turn`` (a policy turn so far) copies one of ``phrases``: is a prefix
    of one, or is one followed by a character that ends a word. True when it has none or is inside an open
    ``<tool>`` call."""
    return all(any(p.startswith(w) or _ends(w, p) for p in phrases) for w in _written(turn))


def is_open(turn: str, phrases: set[str]) -> bool:
    """Whether a count phrase of ``turn`` is still being written (not yet one of ``phrases`` ended)."""
    return any(not any(_ends(w, p) for p in phrases) for w in _written(turn))


def number_tokens(pieces: Sequence[str]) -> list[int]:
    """Ids of the tokens that can end a number word: those holding one, or whose first letters end one
    ("o" after "tw"). Only these can open a count phrase after a turn that has none open."""
    ends = {w[i:] for w in NUMBER_WORDS for i in range(len(w))}
    lead = re.compile(r"[A-Za-z]+")
    out = []
    for t, p in enumerate(pieces):
        head = lead.match(p)
        if _NUMBER.search(p) or (head and head.group(0).lower() in ends):
            out.append(t)
    return out


class CountProcessor:
    """A transformers logits processor: in row ``b``, tokens that would make the turn's last count phrase
    leave every count phrase of ``tool_texts[b]`` get ``-inf`` (module docstring). A row with no allowed
    token is left as it is."""

    def __init__(
        self,
        decode: Any,
        pieces: Sequence[str],
        prompt_length: int,
        tool_texts: Sequence[str],
        numbers: Sequence[int],
    ) -> None:
        self.decode, self.pieces, self.prompt_length, self.numbers = decode, pieces, prompt_length, numbers
        self.phrases = [count_phrases(t) for t in tool_texts]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # input_ids: (B, P + t) ids so far; scores: (B, V) next-token scores
        scores = scores.clone()  # generate keeps the raw logits it passed in (the log-probs): never edit them
        V = min(scores.shape[1], len(self.pieces))
        for b, row in enumerate(input_ids[:, self.prompt_length :].tolist()):
            turn = self.decode(row)[-_TAIL:]
            phrases = self.phrases[b]
            # a phrase open: every token may break it; none open: only a token ending a number word
            # (ids past the tokenizer, a padded head's, are text of no phrase: banned while one is open)
            opened = is_open(turn, phrases)
            candidates = range(V) if opened else self.numbers
            banned = [t for t in candidates if t < V and not allows(turn + self.pieces[t], phrases)]
            if banned and len(banned) < V:
                scores[b, banned] = float("-inf")
                if opened:
                    scores[b, V:] = float("-inf")
        return scores
