"""Colour-correction pairs: the policy's greedy caption (rejected) vs the same caption with its wrong
colours left out (chosen).

The two sides differ only where the caption states a colour the judge rejects, and the chosen side keeps
every object and every colour the judge accepts, so the pair teaches "say no colour where you would say
a wrong one", not "say less". That is what a captioner which reads colours only part of the time can
learn: to state the colours it is sure of (RLHF-V's fine-grained corrections, Yu et al. 2024, applied to
attribute claims; leaving the attribute out rather than replacing it, because a replaced colour asks the
model to read what it cannot).

The judge is the note's colour truth (:func:`scene_colour_judge`, the claims eval's verdict), a labeler
VLM asked "Is there a red fork in the image?" (:func:`labeler_colour_judge`), or the policy's own
confidence in each colour it wrote (:func:`self_colour_judge`); the last two read no ground truth. The
self judge's pairs are the learnable ones: a colour is cut exactly when the model, at that word, put less
than the threshold on it, a function of what the model sees, so DPO can teach it to leave those colours
out before it writes them; truth-judged pairs also cut colours the model was sure of and wrong about, which
nothing it sees tells apart from the right ones.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mm.data.images import open_rgb
from mm.eval import generate
from mm.eval.claims import note_truth
from mm.world.text import article, join_phrases
from rl.pairs.correction import greedy_captions
from rl.pairs.record import PreferencePair
from rl.rewards import attribute_verdicts, claim_extractor, vocabulary

ColourJudge = Callable[[Any, str], list[tuple[int, int]]]
"""``(note, caption) -> character spans [start, end) of the caption's colour words judged wrong``."""

_ARTICLE_BEFORE = re.compile(r"\b([Aa]n?) $")
_SEPARATOR = re.compile(r", | and ")


def _paren_around(caption: str, pos: int) -> tuple[int, int] | None:
    """``(index of "(", index of ")")`` of the bracket that holds character ``pos``, or None."""
    left = caption.rfind("(", 0, pos)
    if left < 0 or caption.rfind(")", left, pos) >= 0:
        return None
    right = caption.find(")", pos)
    return (left, right) if right >= 0 else None


def _strip_in_brackets(caption: str, left: int, right: int, drop: set[int]) -> str:
    """``caption`` with the bracket at ``[left, right]`` keeping only the list items that start at none of
    the characters in ``drop``; the bracket and the space before it go when no item is left."""
    body, items, start = caption[left + 1 : right], [], 0
    for m in [*_SEPARATOR.finditer(body), None]:
        end = m.start() if m else len(body)
        if left + 1 + start not in drop:
            items.append(body[start:end])
        start = m.end() if m else start
    if items:
        return caption[: left + 1] + join_phrases(items) + caption[right:]
    cut = left - 1 if left > 0 and caption[left - 1] == " " else left
    return caption[:cut] + caption[right + 1 :]


def _strip_before_noun(caption: str, start: int, end: int) -> str:
    """``caption`` without the colour word at ``[start, end)`` and the space after it; an article right
    before it ("an orange cup") is re-chosen for the word that now follows ("a cup")."""
    rest = caption[end:].lstrip(" ")
    head = caption[:start]
    m = _ARTICLE_BEFORE.search(head)
    if m and rest:
        new = article(rest)
        new = new.capitalize() if m.group(1)[0].isupper() else new
        head = head[: m.start(1)] + new + " "
    return head + rest


def strip_colours(caption: str, spans: Sequence[tuple[int, int]]) -> str:
    """``caption`` without the colour words at ``spans`` (character ``[start, end)``), in the world
    grammar's two places: before the noun ("a small red spade" -> "a small spade", the article re-chosen:
    "an orange crab" -> "a crab") and in a bracketed list after it ("two bikes (red and white)" -> "two
    bikes (white)"; "a bike (yellow)" -> "a bike"). Everything else is kept character for character."""
    brackets: dict[tuple[int, int], set[int]] = {}
    plain: list[tuple[int, int]] = []
    for start, end in spans:
        if not 0 <= start < end <= len(caption):
            raise ValueError(f"span ({start}, {end}) is not inside a caption of {len(caption)} characters")
        where = _paren_around(caption, start)
        if where is None:
            plain.append((start, end))
        else:
            brackets.setdefault(where, set()).add(start)
    edits = [(s, e, None) for s, e in plain] + [(lr[0], lr[1], brackets[lr]) for lr in brackets]
    for start, end, drop in sorted(edits, reverse=True, key=lambda x: x[0]):  # right to left: offsets hold
        if drop is None:
            caption = _strip_before_noun(caption, start, end)
        else:
            caption = _strip_in_brackets(caption, start, end, drop)
    return caption


def _colour_spans(caption: str, vocab_name: str) -> dict[int, tuple[int, int, str, str]]:
    """Colour claims of ``caption`` by the character their colour word starts at: ``(start, end, object,
    colour)``."""
    return {
        c.span[0]: (c.span[0], c.span[1], c.object, str(c.value))
        for c in claim_extractor(vocab_name).extract(caption)
        if c.kind == "attribute"
    }


def scene_colour_judge(vocab_name: str = "world") -> ColourJudge:
    """Wrong colours by the note's colour truth: a colour no object of that kind in the note has
    (:func:`rl.rewards.attribute_verdicts`, the claims eval's verdict)."""
    vocab = vocabulary(vocab_name)

    def judge(note: Any, caption: str) -> list[tuple[int, int]]:
        spans = _colour_spans(caption, vocab_name)
        wrong = [s for s, bad, _ in attribute_verdicts(caption, note_truth(note, vocab), vocab) if bad]
        return [spans[s][:2] for s in wrong]

    return judge


def labeler_colour_judge(
    labeler: Any, root: str | Path, vocab_name: str = "world", threshold: float = 0.5
) -> ColourJudge:
    """Wrong colours by a labeler VLM: those whose coloured object ("red fork") gets P(yes) below
    ``threshold`` to "Is there a red fork in the image?" about the note's images; no ground truth is
    read."""

    def judge(note: Any, caption: str) -> list[tuple[int, int]]:
        spans = _colour_spans(caption, vocab_name)
        if not spans:
            return []
        images = [open_rgb(p) for p in generate.note_images(note, root)]
        asked = sorted({f"{c} {o}" for _, _, o, c in spans.values()})
        p = labeler.verify_objects(images, asked)
        return [(s, e) for s, e, o, c in spans.values() if p[f"{c} {o}"] < threshold]

    return judge


def self_colour_judge(
    model: Any, processor: Any, root: str | Path, *, prompt: str, threshold: float = 0.5
) -> ColourJudge:
    """Unsure colours by the policy itself: those whose colour word's first token it gave probability below
    ``threshold``, teacher-forced on the caption with the note's images (the confidence of
    ``benchmarks/colour_reading.py confidence``); no ground truth is read. A caption the tokenizer does not
    spell back exactly (unknown words) gets no cut."""
    import torch

    from mm.model.processing import IGNORE_INDEX
    from rl.rewards import char_tokens

    device = next(model.parameters()).device
    tok = processor.tokenizer

    def judge(note: Any, caption: str) -> list[tuple[int, int]]:
        spans = _colour_spans(caption, "world")
        if not spans:
            return []
        images = [open_rgb(p) for p in generate.note_images(note, root)]
        batch = processor.collate([processor.encode(images, prompt, caption)])
        batch = {k: v.to(device) for k, v in batch.items()}
        labels = batch.pop("labels")[0]  # (T,)
        was_training = model.training
        model.eval()  # the judge is called between training steps' pair building: no dropout here
        try:
            with torch.no_grad():
                logits = model(**batch).logits[0].float()  # (T, V)
        finally:
            model.train(was_training)
        where = (labels != IGNORE_INDEX).nonzero().flatten()  # positions of the caption tokens (+ eos)
        ids = labels[where].tolist()
        logp = torch.log_softmax(logits[where - 1], dim=-1).gather(1, labels[where][:, None])[:, 0]  # (R,)
        text = [tok.decode(ids[:k], skip_special_tokens=True) for k in range(len(ids) + 1)]
        if text[-1] != caption:
            return []  # the tokens do not spell the caption back: its colour words cannot be placed
        pieces = [b[len(a) :] for a, b in zip(text, text[1:])]  # what each token adds to the text
        first = char_tokens(pieces, list(spans))
        return [spans[s][:2] for s, i in zip(spans, first) if logp[i].exp().item() < threshold]

    return judge


def colour_correction_pairs(
    model: Any,
    processor: Any,
    notes: Sequence[Any],
    root: str | Path,
    *,
    prompt: str,
    judge: ColourJudge,
    max_new_tokens: int = 128,
    batch_size: int = 32,
    with_objects: bool = True,
    keep_pairs: bool = False,
) -> list[PreferencePair]:
    """Per note whose greedy caption states a colour ``judge`` rejects: rejected = that caption, chosen =
    :func:`strip_colours` of it. Notes with no rejected colour give no pair. With ``keep_pairs``, each note
    whose caption keeps a colour also gives the other side of the lesson: chosen = the corrected caption,
    rejected = it without one of its kept colours (picked by the note id), so that leaving colours out is
    not the easy way to win the first pairs. ``with_objects`` False leaves the notes' objects out of the
    pairs (a judge that reads no ground truth)."""
    caps = greedy_captions(model, processor, notes, root, prompt, batch_size, max_new_tokens)
    out = []
    for note, cap in zip(notes, caps):
        wrong = judge(note, cap)
        fixed = strip_colours(cap, wrong)
        sides = [("colourfix", fixed, cap, [cap[s:e] for s, e in wrong])] if wrong else []
        kept = [v[:2] for v in _colour_spans(fixed, "world").values()]
        if keep_pairs and kept:
            one = kept[zlib.crc32(note.id.encode()) % len(kept)]  # one colour, as a cut pair cuts one or two
            sides.append(("colourkeep", fixed, strip_colours(fixed, [one]), [fixed[one[0] : one[1]]]))
        for tag, chosen, rejected, removed in sides:
            out.append(
                PreferencePair(
                    id=f"{note.id}-{tag}-0",
                    kind="colourfix",
                    note_id=note.id,
                    images=list(note.images),
                    prompt=prompt,
                    chosen=chosen,
                    rejected=rejected,
                    objects=sorted(note.categories) if with_objects else [],
                    meta={"removed": removed, "keeps": tag == "colourkeep"},
                )
            )
    return out
