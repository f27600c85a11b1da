"""Caption -> atomic claims, each with its character span (for token-level credit).

Three claim kinds (the AMBER families that a caption of objects can state; relations are not extracted):

- ``exists``: an object is there ("a fork"). One per object mention, exactly CHAIR's mentions.
- ``attribute``: an object has a colour ("a *red* fork", "two forks (*red* and *blue*)").
- ``count``: an object appears n times ("*two* forks", "*3* dogs"); only explicit numerals make a
  count claim ("a fork" claims existence, not "exactly one").

:class:`RuleExtractor` finds the mentions with the CHAIR machinery (:class:`mm.eval.chair.Vocabulary`:
the same singularising, merges and synonym table, so on the same caption ``exists`` claims are
CHAIR's mentions), but on a span-keeping tokeniser, then reads the modifiers right before the noun
(colours, sizes, numerals: "two small red forks") and a bracketed colour list right after it (the
world grammar's "two forks (red and blue)"). A sentence that opens "In the second photo" scopes its
claims to that image (``Claim.image``). An LLM-based extractor implements :class:`ClaimExtractor`
(``extract(caption) -> list[Claim]``) and is registered in :data:`EXTRACTORS`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from mm.errors import UserError
from mm.eval.chair import Vocabulary
from mm.eval.singularize import singularize
from mm.world import vocab as world_vocab

CLAIM_KINDS: tuple[str, ...] = ("exists", "attribute", "count")
"""The claim kinds, in report order."""

COLOR_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        (*world_vocab.COLORS, "black", "brown", "gray", "grey", "pink", "silver", "gold", "tan", "beige")
    )
)
"""Colour words read as attributes (the world's palette plus common English colours)."""

SIZE_WORDS: frozenset[str] = frozenset({*world_vocab.SIZES, "big", "little", "tiny", "huge"})
"""Size words skipped between a numeral/colour and the noun (not claims)."""

NUMBER_WORDS: dict[str, int] = {
    w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())
}
"""Numerals read as counts (digits are read too)."""

ORDINAL_WORDS: dict[str, int] = {
    w: i for i, w in enumerate("first second third fourth fifth sixth seventh eighth".split())
}
"""Ordinals of "In the second photo" (0-based image index)."""

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*|[^\sA-Za-z0-9]")
_SENTENCE_END = frozenset(".!?")
_IMAGE_WORDS = frozenset({"photo", "image", "picture"})


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One atomic claim of a caption."""

    kind: str
    """``exists``, ``attribute`` or ``count``."""
    object: str
    """Canonical object name."""
    value: str | int | None
    """The colour (``attribute``), the number (``count``), None (``exists``)."""
    span: tuple[int, int]
    """Characters ``[start, end)`` of the words that make the claim: the noun for ``exists``, the
    colour word for ``attribute``, the numeral for ``count``."""
    noun_span: tuple[int, int]
    """Characters ``[start, end)`` of the object's noun (the mention)."""
    image: int | None = None
    """0-based image the claim is about ("In the second photo, ..."), or None for the whole note."""

    def text(self, caption: str) -> str:
        """The words of ``caption`` the claim rests on."""
        return caption[self.span[0] : self.span[1]]

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "object": self.object,
            "value": self.value,
            "span": list(self.span),
            "noun_span": list(self.noun_span),
            "image": self.image,
        }


class ClaimExtractor(ABC):
    """Caption -> claims. Implementations: :class:`RuleExtractor`; an LLM-based one can follow."""

    name: str = "abstract"
    """Short name reported with the scores."""

    @property
    @abstractmethod
    def vocabulary(self) -> Vocabulary:
        """How ground-truth object names map to canonical ones (claims use the canonical names)."""

    @abstractmethod
    def extract(self, caption: str) -> list[Claim]:
        """Every claim of ``caption`` in caption order (a mention's exists claim first)."""


@dataclass(frozen=True)
class _Tok:
    norm: str
    start: int
    end: int


def _tokens(caption: str, vocab: Vocabulary) -> list[_Tok]:
    """Lower-cased (and, for COCO, singularised) tokens with spans; vocabulary n-grams merged."""
    raw = []
    for m in _TOKEN.finditer(caption):
        w = m.group().lower()
        if vocab.singularize and w[:1].isalnum():
            w = singularize(w)
        raw.append(_Tok(w, m.start(), m.end()))
    out, i = [], 0
    while i < len(raw):
        for n in range(min(vocab.max_merge, len(raw) - i), 1, -1):
            gram = " ".join(t.norm for t in raw[i : i + n])
            if gram in vocab.merges:
                out.append(_Tok(vocab.merges[gram], raw[i].start, raw[i + n - 1].end))
                i += n
                break
        else:
            out.append(raw[i])
            i += 1
    return out


def _number(word: str) -> int | None:
    if word.isdigit():
        return int(word)
    return NUMBER_WORDS.get(word)


class RuleExtractor(ClaimExtractor):
    """Rule-based claims over a CHAIR :class:`Vocabulary` (world grammar and COCO-style English)."""

    def __init__(self, vocab: Vocabulary, *, colors: tuple[str, ...] = COLOR_WORDS) -> None:
        self._vocab = vocab
        self.name = vocab.name
        self.colors = frozenset(colors)

    @property
    def vocabulary(self) -> Vocabulary:
        return self._vocab

    def _image_scope(self, sentence: list[_Tok]) -> int | None:
        """Image index of a sentence opening "In the second photo" / "In photo 2" (else None)."""
        words = [t.norm for t in sentence[:4]]
        if len(words) >= 4 and words[:2] == ["in", "the"] and words[3] in _IMAGE_WORDS:
            return ORDINAL_WORDS.get(words[2])
        if len(words) >= 3 and words[0] == "in" and words[1] in _IMAGE_WORDS:
            n = _number(words[2])
            return None if n is None or n < 1 else n - 1
        return None

    def extract(self, caption: str) -> list[Claim]:
        toks = _tokens(caption, self._vocab)
        drop_seat = self._vocab.toilet_seat_rule and {"toilet", "seat"} <= {t.norm for t in toks}
        claims: list[Claim] = []
        start = 0
        for end in [i for i, t in enumerate(toks) if t.norm in _SENTENCE_END] + [len(toks)]:
            sentence = toks[start:end]
            image = self._image_scope(sentence)
            for j, t in enumerate(sentence):
                obj = self._vocab.forms.get(t.norm)
                if obj is None or (drop_seat and t.norm == "seat"):
                    continue
                claims += self._claims_at(sentence, j, obj, image)
            start = end + 1
        return claims

    def _claims_at(self, toks: list[_Tok], j: int, obj: str, image: int | None) -> list[Claim]:
        noun = (toks[j].start, toks[j].end)
        out = [Claim(kind="exists", object=obj, value=None, span=noun, noun_span=noun, image=image)]
        k = j - 1
        while k >= 0 and (toks[k].norm in self.colors or toks[k].norm in SIZE_WORDS):
            if toks[k].norm in self.colors:
                out.append(self._attr(toks[k], obj, noun, image))
            k -= 1
        n = _number(toks[k].norm) if k >= 0 else None
        if n is not None:
            span = (toks[k].start, toks[k].end)
            out.append(Claim(kind="count", object=obj, value=n, span=span, noun_span=noun, image=image))
        if j + 1 < len(toks) and toks[j + 1].norm == "(":
            for t in toks[j + 2 :]:
                if t.norm == ")":
                    break
                if t.norm in self.colors:
                    out.append(self._attr(t, obj, noun, image))
                elif t.norm not in (",", "and"):
                    break
        return out

    @staticmethod
    def _attr(t: _Tok, obj: str, noun: tuple[int, int], image: int | None) -> Claim:
        return Claim(
            kind="attribute", object=obj, value=t.norm, span=(t.start, t.end), noun_span=noun, image=image
        )


EXTRACTORS: dict[str, Callable[[], ClaimExtractor]] = {
    "world": lambda: RuleExtractor(Vocabulary.world()),
    "coco": lambda: RuleExtractor(Vocabulary.coco()),
}
"""Extractor name -> builder."""


def build_extractor(name: str) -> ClaimExtractor:
    """The extractor called ``name`` (:data:`EXTRACTORS`)."""
    if name not in EXTRACTORS:
        raise UserError(f"unknown claim extractor {name!r}; expected one of {', '.join(EXTRACTORS)}")
    return EXTRACTORS[name]()
