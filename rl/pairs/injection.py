"""Object-injection pairs (POVID, Zhou et al. 2024; HA-DPO, Zhao et al. 2023).

Chosen = the note's ground-truth caption; rejected = the same caption with an *absent* object added (a
new sentence "There is also a knife.") or swapped in for a present one ("a fork" -> "a knife"). The
injected object is preferably a co-occurrence partner of a present object (the language prior the model
must unlearn). Deviation: POVID makes its rejected answers with GPT-4V; we edit the ground truth with the
world's own nouns, articles and synonyms, so the edit is exact and fluent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from mm.world import text as wtext
from mm.world import vocab
from rl.pairs.record import PreferencePair, caption_pair
from rl.rewards import vocabulary

ALSO_TEMPLATES: tuple[str, ...] = ("There is also {x}.", "I can also see {x}.", "Next to it, there is {x}.")
"""Sentences that add an injected object to a caption."""


def _plural_forms() -> set[str]:
    return {c.plural for c in vocab.CATEGORIES} | {p for c in vocab.CATEGORIES for p in c.synonym_plurals}


def _find_form(text: str, name: str) -> re.Match[str] | None:
    """First occurrence of a surface form of category ``name`` in ``text`` (longest forms first)."""
    forms = sorted(vocab.category(name).forms, key=len, reverse=True)
    pattern = r"\b(" + "|".join(re.escape(f) for f in forms) + r")\b"
    return re.search(pattern, text, flags=re.IGNORECASE)


def choose_injected(
    present: set[str], rng: np.random.Generator, *, partner_prob: float = 1.0
) -> tuple[str, str | None]:
    """``(absent category, present partner or None)``: an absent partner of a present object with
    probability ``partner_prob`` when there is one, else a random absent category."""
    partners = sorted({q: p for p in sorted(present) for q in vocab.partners(p) if q not in present}.items())
    if partners and rng.random() < partner_prob:
        name, anchor = partners[int(rng.integers(len(partners)))]
        return name, anchor
    absent = [c for c in vocab.CATEGORY_NAMES if c not in present]
    return absent[int(rng.integers(len(absent)))], None


def inject_object(
    caption: str,
    present: set[str],
    rng: np.random.Generator,
    *,
    partner_prob: float = 1.0,
    swap_prob: float = 0.5,
    synonym_prob: float = 0.3,
) -> tuple[str, dict[str, Any]] | None:
    """The caption with one absent object added or swapped in, and what was done (None if impossible).

    ``add``: a sentence naming the object is inserted after the sentence that mentions its partner
    (or at the end). ``swap``: the first mention of a present object (its partner when there is one)
    is replaced by the absent object's name, keeping number and fixing ``a``/``an``.
    """
    name, anchor = choose_injected(present, rng, partner_prob=partner_prob)
    target = (
        anchor
        if anchor is not None
        else (sorted(present)[int(rng.integers(len(present)))] if present else None)
    )
    m = _find_form(caption, target) if target is not None else None
    if m is not None and rng.random() < swap_prob:
        plural = m.group(1).lower() in _plural_forms()
        noun = wtext.surface(name, plural, rng, synonym_prob)
        before = caption[: m.start()]
        art = re.search(r"\b(a|an|A|An)\s+$", before)
        if art is not None and not plural:
            new_art = wtext.article(noun)
            new_art = new_art.capitalize() if art.group(1)[0].isupper() else new_art
            before = before[: art.start()] + new_art + before[art.start() + len(art.group(1)) :]
        rejected = before + noun + caption[m.end() :]
        return rejected, {"injected": name, "mode": "swap", "replaced": target, "partner_of": anchor}
    noun = wtext.surface(name, False, rng, synonym_prob)
    phrase = f"{wtext.article(noun)} {noun}"
    sentence = ALSO_TEMPLATES[int(rng.integers(len(ALSO_TEMPLATES)))].format(x=phrase)
    cut = len(caption)
    if m is not None:
        end = caption.find(".", m.end())
        cut = end + 1 if end != -1 else len(caption)
    head, tail = caption[:cut].rstrip(), caption[cut:].lstrip()
    if head and head[-1] not in ".!?":
        head += "."
    rejected = " ".join(s for s in (head, sentence, tail) if s)
    return rejected, {"injected": name, "mode": "add", "replaced": None, "partner_of": anchor}


def injection_pairs(
    notes: Sequence[Any],
    *,
    prompt: str,
    seed: int = 0,
    partner_prob: float = 1.0,
    swap_prob: float = 0.5,
    reward_cfg: Any = None,
) -> list[PreferencePair]:
    """One injection pair per note with a caption (world vocabulary; see :func:`inject_object`).

    A pair is kept only when the rejected caption really mentions the injected object (checked
    with the CHAIR vocabulary), so every rejected caption hallucinates at least once more.
    """
    rng = np.random.default_rng(seed)
    chair_vocab = vocabulary("world")
    out = []
    for note in notes:
        caption = note.text.strip()
        if not caption:
            continue
        present = set(note.categories)
        edit = inject_object(caption, present, rng, partner_prob=partner_prob, swap_prob=swap_prob)
        if edit is None:
            continue
        rejected, meta = edit
        if meta["injected"] not in {c for _, c in chair_vocab.mentions(rejected)}:
            continue
        out.append(caption_pair(note, "injection", prompt, caption, rejected, reward_cfg, meta))
    return out
