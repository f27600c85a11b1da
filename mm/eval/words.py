"""Caption words for CHAIR: an offline tokeniser that follows ``nltk.word_tokenize`` (Punkt + Treebank).

The original CHAIR script tokenises lower-cased captions with ``nltk.word_tokenize``, which needs
the downloaded Punkt model for sentence splitting. We need neither NLTK nor a download:

1. Sentence splitting (approximates Punkt): a sentence ends at ``.``, ``?`` or ``!`` (plus any
   closing quotes/brackets) followed by white space, except after a known abbreviation
   (:data:`ABBREVIATIONS`), a single letter (``a.``) or a token with an inner period
   (``e.g.``, ``u.s.``). Punkt learns abbreviations from data; this fixed list is the deviation.
2. Each sentence goes through the Treebank rules NLTK applies (starting quotes, punctuation,
   brackets, double dashes, ending quotes, clitics ``'s n't 're 've 'll 'm 'd``, ``cannot`` ...),
   so ``dogs.`` -> ``dogs .``, ``dog's`` -> ``dog 's``, ``(cat)`` -> ``( cat )``; hyphens and
   slashes stay inside a token (``hot-dog`` is one token, as in NLTK).

For CHAIR only tokens that can be object words matter; on caption text the two agree on all the
cases in ``tests/mm/test_chair*.py``.
"""

from __future__ import annotations

import re

ABBREVIATIONS: frozenset[str] = frozenset(
    "mr mrs ms dr prof st jr sr vs etc inc ltd co corp mt ft no approx dept est fig".split()
)
"""Lower-case abbreviations after which a period does not end a sentence."""

_SENT_END = re.compile(r"""([.?!]+)(['")\]}]*)(\s+)""")

_STARTING_QUOTES = [
    (re.compile(r"([«“‘„]|[`]+)"), r" \1 "),
    (re.compile(r'^"'), r"``"),
    (re.compile(r"(``)"), r" \1 "),
    (re.compile(r"([ \(\[{<])(\"|\'{2})"), r"\1 `` "),
    (re.compile(r"(?i)(\')(?!re|ve|ll|m|t|s|d|n)(\w)\b"), r"\1 \2"),
]
_PUNCTUATION = [
    (re.compile(r"([^\.])(\.)([\]\)}>\"\']*)\s*$"), r"\1 \2 \3 "),
    (re.compile(r"([:,])([^\d])"), r" \1 \2"),
    (re.compile(r"([:,])$"), r" \1 "),
    (re.compile(r"\.{2,}"), r" \g<0> "),
    (re.compile(r"[;@#$%&]"), r" \g<0> "),
    (re.compile(r"[?!]"), r" \g<0> "),
    (re.compile(r"([^'])' "), r"\1 ' "),
    (re.compile(r"[*]"), r" \g<0> "),
]
_BRACKETS = (re.compile(r"[\]\[\(\)\{\}\<\>]"), r" \g<0> ")
_DOUBLE_DASHES = (re.compile(r"--"), r" -- ")
_ENDING_QUOTES = [
    (re.compile(r"([»”’])"), r" \1 "),
    (re.compile(r"''"), " '' "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') "), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), r"\1 \2 "),
]
_CONTRACTIONS = [
    re.compile(p)
    for p in (
        r"(?i)\b(can)(not)\b",
        r"(?i)\b(d)('ye)\b",
        r"(?i)\b(gim)(me)\b",
        r"(?i)\b(gon)(na)\b",
        r"(?i)\b(got)(ta)\b",
        r"(?i)\b(lem)(me)\b",
        r"(?i)\b(more)('n)\b",
        r"(?i)\b(wan)(na)(?=\s)",
        r"(?i) ('t)(is)\b",
        r"(?i) ('t)(was)\b",
    )
]


def _is_abbreviation(token: str) -> bool:
    word = token.rstrip(".").lstrip("\"'([{").lower()
    return len(word) == 1 or "." in word or word in ABBREVIATIONS


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences (Punkt-like; see the module docstring)."""
    sentences, start = [], 0
    for m in _SENT_END.finditer(text):
        if m.group(1) == ".":
            before = text[start : m.start()].split()
            if before and _is_abbreviation(before[-1]):
                continue
        sentences.append(text[start : m.end(2)].strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]


def treebank_words(sentence: str) -> list[str]:
    """Treebank word tokens of one sentence (NLTK's ``NLTKWordTokenizer`` rules)."""
    text = sentence
    for pattern, sub in _STARTING_QUOTES:
        text = pattern.sub(sub, text)
    for pattern, sub in _PUNCTUATION:
        text = pattern.sub(sub, text)
    text = _BRACKETS[0].sub(_BRACKETS[1], text)
    text = _DOUBLE_DASHES[0].sub(_DOUBLE_DASHES[1], text)
    text = " " + text + " "
    for pattern, sub in _ENDING_QUOTES:
        text = pattern.sub(sub, text)
    for pattern in _CONTRACTIONS:
        text = pattern.sub(r" \1 \2 ", text)
    return text.split()


def word_tokenize(text: str) -> list[str]:
    """Word tokens of ``text``, sentence by sentence, like ``nltk.word_tokenize``."""
    return [tok for sent in split_sentences(text) for tok in treebank_words(sent)]
