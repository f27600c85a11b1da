"""Correction pairs (RLHF-V, Yu et al. 2024, fine-grained corrections; HSA-DPO).

Rejected = the policy's own greedy caption, chosen = the same caption with every hallucinated object
phrase cut out or replaced by a missed object (:func:`strip_objects`). The pair differs exactly at the
model's real hallucinations, partners or not, and the chosen side keeps every correct mention, so it does
not teach the model to say less. Deviation: RLHF-V's corrections are written by people; the world's scene
makes them exact.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mm.eval import generate
from mm.world import text as wtext
from mm.world.text import join_phrases
from rl.pairs.record import PreferencePair, caption_pair
from rl.rewards import vocabulary

_ITEM_START = re.compile(r"\b(a|an|one|two|three|four|five|six|seven|eight)\s", re.IGNORECASE)


def _split_items(body: str) -> list[str]:
    """List items of a sentence body split at ", " and " and " (not inside parentheses)."""
    items, depth, start, i = [], 0, 0, 0
    while i < len(body):
        ch = body[i]
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            for sep in (", ", " and "):
                if body.startswith(sep, i):
                    items.append(body[start:i])
                    start = i = i + len(sep)
                    break
            else:
                i += 1
            continue
        i += 1
    items.append(body[start:])
    return items


def strip_objects(caption: str, drop: set[str], substitutes: Sequence[str] = ()) -> str | None:
    """``caption`` with every list item naming a category of ``drop`` replaced by the next of
    ``substitutes`` (noun phrases such as "a blue cup"), or cut out when none is left; None when nothing
    changed.

    Works sentence by sentence on the world's caption grammar ("In the second photo, a red fork, two
    knives (blue and red) and a cup."): items are split at ", " / " and " outside parentheses, an item
    whose words mention a dropped category (CHAIR's world vocabulary: synonyms and plurals) is replaced or
    removed, the rest is re-joined with commas and a final "and"; a sentence left with no object is removed.
    """
    vocab = vocabulary("world")

    def names(text: str) -> set[str]:
        return {c for _, c in vocab.mentions(text)}

    out, changed, subs = [], False, list(substitutes)
    for sentence in re.split(r"(?<=[.!?])\s+", caption.strip()):
        if not sentence or not (names(sentence) & drop):
            out.append(sentence)
            continue
        end = sentence[-1] if sentence[-1] in ".!?" else ""
        items = _split_items(sentence[: len(sentence) - len(end)])
        lead = []  # items before the first object ("In the second photo")
        while items and not names(items[0]):
            lead.append(items.pop(0))
        if not items:
            out.append(sentence)
            continue
        m = _ITEM_START.search(items[0])
        prefix = items[0][: m.start()] if m else ""
        items[0] = items[0][len(prefix) :]
        kept = []
        for it in items:
            if not (names(it) & drop):
                kept.append(it)
            elif subs:
                kept.append(subs.pop(0))
        changed = True
        if not kept:
            continue
        if not prefix and not lead and items[0][:1].isupper():
            kept[0] = kept[0][:1].upper() + kept[0][1:]
        if kept[0] is not items[0] and (prefix or lead):
            kept[0] = kept[0][:1].lower() + kept[0][1:]
        body = prefix + join_phrases(kept)
        out.append(", ".join([*lead, body]) + end)
    return " ".join(out) if changed else None


def _count_items(caption: str, drop: set[str]) -> int:
    """How many list items of ``caption`` name a category of ``drop`` (what :func:`strip_objects` edits)."""
    vocab = vocabulary("world")
    n = 0
    for sentence in re.split(r"(?<=[.!?])\s+", caption.strip()):
        body = sentence.rstrip(".!?")
        n += sum(bool({c for _, c in vocab.mentions(it)} & drop) for it in _split_items(body))
    return n


def _missed_phrases(note: Any, missed: set[str]) -> list[str]:
    """ "a blue cup" for each category in ``missed``, with the colour of its first annotation, in the
    world's mention order."""
    first: dict[str, Any] = {}
    for objs in note.objects:
        for o in objs:
            first.setdefault(o.category, o)
    out = []
    for name in sorted(missed, key=lambda c: wtext.CATEGORY_INDEX.get(c, 1_000)):
        o = first.get(name)
        head = f"{o.color} {name}" if o is not None and o.color else name
        out.append(f"{wtext.article(head)} {head}")
    return out


def greedy_captions(
    model: Any,
    processor: Any,
    notes: Sequence[Any],
    root: str | Path,
    prompt: str,
    batch_size: int,
    max_new_tokens: int,
) -> list[str]:
    """The policy's greedy caption of each note, generated in eval mode (its train/eval mode restored)."""
    was_training = model.training
    model.eval()
    try:
        return generate.generate_captions(
            model, processor, list(notes), prompt, batch_size, max_new_tokens, root=root
        )
    finally:
        model.train(was_training)


def correction_pairs(
    model: Any,
    processor: Any,
    notes: Sequence[Any],
    root: str | Path,
    *,
    prompt: str,
    max_new_tokens: int = 128,
    batch_size: int = 32,
    substitute: bool = True,
    reward_cfg: Any = None,
) -> list[PreferencePair]:
    """RLHF-V-style pairs: the policy's greedy caption (rejected) vs the same caption corrected (chosen,
    :func:`strip_objects`). With ``substitute`` (default) each hallucinated object is replaced by an object
    of the note the caption missed ("a blue cup", its annotated colour), and a note is skipped when its
    caption has more hallucinated items than missed objects; without, the hallucinated items are cut.
    Notes whose caption has no hallucination give no pair.

    Substituting keeps both sides listing the same number of objects. With cuts, DPO learned "list less"
    (measured here from a 0.741-recall SFT model: CHAIR_i -44% but recall -31 points, length -31%; with
    replacements where possible and cuts otherwise, still recall -22 points, length -23%)."""
    vocab = vocabulary("world")
    caps = greedy_captions(model, processor, notes, root, prompt, batch_size, max_new_tokens)
    out = []
    for note, cap in zip(notes, caps):
        present = set(note.categories)
        said = {c for _, c in vocab.mentions(cap)}
        wrong = said - present
        subs = _missed_phrases(note, present - said) if substitute else []
        if substitute and len(subs) < _count_items(cap, wrong):
            continue  # not every hallucination has a replacement: the chosen side would list fewer objects
        fixed = strip_objects(cap, wrong, subs) if wrong else None
        if not fixed or {c for _, c in vocab.mentions(fixed)} & wrong:
            continue
        meta = {"removed": sorted(wrong), "substitutes": subs}
        out.append(caption_pair(note, "correction", prompt, fixed, cap, reward_cfg, meta))
    return out
