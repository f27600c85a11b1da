"""Discriminative claim eval: yes/no questions per claim kind, built like POPE, and their scores.

Per image and per kind, every true fact gives a ``yes`` question and a false one of the same object
gives the paired ``no`` question (AMBER's discriminative part, with POPE's three negative samplers):

=========  ===========================  ==============================================================
kind       yes                          no, by ``split``
=========  ===========================  ==============================================================
exists     a present object             POPE's own builder (:func:`mm.eval.pope.build_questions`):
                                        random / popular / adversarial (co-occurring) absent objects
attribute  a colour the object has      random: any colour it lacks; popular: the most frequent colour
                                        of the data it lacks; adversarial: a colour *another object of
                                        the same image* has (a binding error), else popular
count      the object's true number     random: any other number in 1..max(``max_count``, n + 1);
                                        popular: the most frequent number of the data; adversarial:
                                        off by one (n + 1 for n = 1, else n - 1 or n + 1 at random)
=========  ===========================  ==============================================================

Attribute questions are asked only where the object's colours are known. Scores per kind are
POPE's (:func:`mm.eval.pope.pope_scores`), each with a bootstrap interval over images.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mm.eval.claims.extract import CLAIM_KINDS
from mm.eval.claims.truth import ImageTruth
from mm.eval.pope import SPLITS, PopeBuildConfig, build_questions, pope_scores
from mm.world import vocab as world_vocab
from mm.world.text import NUMBERS, article


@dataclass(frozen=True, kw_only=True)
class ClaimQuestionConfig:
    """How to build the yes/no claim questions."""

    split: str = "adversarial"
    """Negative sampling: ``random``, ``popular`` or ``adversarial`` (module docstring)."""
    seed: int = 0
    """Seed of every random choice (same seed, same questions)."""
    kinds: tuple[str, ...] = CLAIM_KINDS
    """Claim kinds to ask about."""
    where: str = "in this note"
    """Words after the object ("Is there a fork in this note?"; POPE says "in the image")."""
    max_count: int = 4
    """Largest wrong number a ``random`` count negative may take (at least n + 1)."""

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        bad = [k for k in self.kinds if k not in CLAIM_KINDS]
        if bad or not self.kinds:
            raise ValueError(f"kinds must be a non-empty subset of {CLAIM_KINDS}, got {self.kinds!r}")
        if self.max_count < 2:
            raise ValueError(f"max_count must be >= 2, got {self.max_count}")


def plural(name: str) -> str:
    """Plural of an object name: the world vocabulary's, else English rules (cup -> cups, bus -> buses)."""
    if name in world_vocab.CATEGORY_NAMES:
        return world_vocab.category(name).plural
    if name.endswith(("s", "x", "ch", "sh")):
        return name + "es"
    if name.endswith("y") and name[-2:-1] not in "aeiou":
        return name[:-1] + "ies"
    return name + "s"


def _number(n: int) -> str:
    return NUMBERS[n] if n < len(NUMBERS) else str(n)


def _q(kind: str, image: str, obj: str, value: Any, label: str, where: str) -> dict[str, Any]:
    if kind == "attribute":
        text = f"Is there {article(value)} {value} {obj} {where}?"
    elif n := value if kind == "count" else 0:
        text = (
            f"Is there exactly one {obj} {where}?"
            if n == 1
            else f"Are there {_number(n)} {plural(obj)} {where}?"
        )
    else:
        text = f"Is there {article(obj)} {obj} {where}?"
    return {"image": image, "text": text, "label": label, "kind": kind, "object": obj, "value": value}


def _color_negative(
    t_colors: frozenset[str],
    others: set[str],
    palette: Sequence[str],
    freq: Counter,
    split: str,
    rng: random.Random,
) -> str | None:
    lacking = [c for c in palette if c not in t_colors]
    if not lacking:
        return None
    by_freq = sorted(lacking, key=lambda c: (-freq[c], c))
    if split == "random":
        return rng.choice(lacking)
    if split == "adversarial":
        binding = [c for c in by_freq if c in others]
        if binding:
            return binding[0]
    return by_freq[0]


def _count_negative(n: int, freq: Counter, cfg: ClaimQuestionConfig, rng: random.Random) -> int:
    if cfg.split == "random":
        return rng.choice([m for m in range(1, max(cfg.max_count, n + 1) + 1) if m != n])
    if cfg.split == "popular":
        ranked = sorted((m for m in freq if m != n), key=lambda m: (-freq[m], m))
        return ranked[0] if ranked else n + 1
    return n + 1 if n == 1 else rng.choice((n - 1, n + 1))


def build_claim_questions(
    images: Mapping[str, ImageTruth],
    cfg: ClaimQuestionConfig,
    *,
    categories: Sequence[str],
    palette: Sequence[str] = world_vocab.COLORS,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Questions ``{question_id, image, text, label, kind, object, value}`` per image and kind, in yes/no
    pairs, and warnings. ``categories``: the object universe for existence negatives; ``palette``: the
    colours for attribute negatives (colours seen in ``images`` are added)."""
    rng = random.Random(cfg.seed)
    warn: list[str] = []
    out: list[dict[str, Any]] = []
    palette = list(
        dict.fromkeys(
            [*palette, *sorted({c for im in images.values() for t in im.values() for c in t.colors})]
        )
    )
    if "exists" in cfg.kinds:
        template = "Is there a {object} " + cfg.where + "?"
        qs, w = build_questions(
            {k: sorted(v) for k, v in images.items()},
            PopeBuildConfig(split=cfg.split, seed=cfg.seed, template=template),
            categories=categories,
        )
        warn += w
        prefix = "Is there a "
        for q in qs:
            obj = q["text"][len(prefix) : -len(" " + cfg.where + "?")]
            out.append(_q("exists", q["image"], obj, None, q["label"], cfg.where))
    color_freq = Counter(c for im in images.values() for t in im.values() for c in t.colors)
    count_freq = Counter(t.count for im in images.values() for t in im.values())
    for image in sorted(images):
        truth = images[image]
        for obj in sorted(truth):
            t = truth[obj]
            if "attribute" in cfg.kinds and t.colors_known and t.colors:
                others = {c for o, u in truth.items() if o != obj for c in u.colors}
                neg = _color_negative(t.colors, others, palette, color_freq, cfg.split, rng)
                if neg is not None:
                    out.append(_q("attribute", image, obj, rng.choice(sorted(t.colors)), "yes", cfg.where))
                    out.append(_q("attribute", image, obj, neg, "no", cfg.where))
            if "count" in cfg.kinds:
                out.append(_q("count", image, obj, t.count, "yes", cfg.where))
                out.append(
                    _q("count", image, obj, _count_negative(t.count, count_freq, cfg, rng), "no", cfg.where)
                )
    for i, q in enumerate(out):
        q["question_id"] = f"{q['kind']}-{i + 1}"
    return out, warn


def discriminative_scores(
    questions: Sequence[Mapping[str, Any]],
    answers: Mapping[str, str],
    *,
    parser: str = "original",
) -> dict[str, Any]:
    """Per kind: POPE's scores of ``answers`` (``{question_id: text}``) plus ``intervals`` over images."""
    out: dict[str, Any] = {}
    for kind in CLAIM_KINDS:
        qs = [q for q in questions if q.get("kind", "exists") == kind]
        if not qs:
            continue
        labels = {str(q["question_id"]): q["label"] for q in qs}
        mine = {k: v for k, v in answers.items() if k in labels}
        res = pope_scores(labels, mine, parser=parser, units={str(q["question_id"]): q["image"] for q in qs})
        res["n_questions"] = len(qs)
        out[kind] = res
    return out
