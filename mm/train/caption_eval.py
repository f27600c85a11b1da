"""Scores of generated note captions against the notes' objects (pure; CHAIR on the world vocabulary).

``caption_object_metrics`` returns CHAIR_i / CHAIR_s (Rohrbach et al., 2018, via
:func:`mm.eval.chair.chair_scores`), object recall, object precision (= 1 - CHAIR_i: the fraction of
object mentions that are present), mean length, and the split of hallucinated mentions by cause:

``partner`` (a co-occurrence partner of a present object: the language prior), ``confusion`` (a
look-alike of a present object) or ``other``, as defined in :mod:`mm.eval.causes`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from mm.eval.causes import CAUSES as HALLUCINATION_CAUSES
from mm.eval.causes import hallucination_cause
from mm.eval.chair import Vocabulary, chair_scores


def caption_object_metrics(
    captions: Sequence[str], objects: Sequence[set[str]], *, world: bool = True
) -> dict[str, Any]:
    """CHAIR, recall, precision, length and hallucination causes of ``captions[i]`` vs ``objects[i]``.

    ``objects[i]`` are the canonical categories present in note i. ``world=False`` uses the COCO
    vocabulary and skips the cause split (it needs the world's partner/shape tables).
    """
    if len(captions) != len(objects):
        raise ValueError(f"need one object set per caption, got {len(captions)} and {len(objects)}")
    vocab = Vocabulary.world() if world else Vocabulary.coco()
    caps = {str(i): c for i, c in enumerate(captions)}
    gts = {str(i): sorted(o) for i, o in enumerate(objects)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        s = chair_scores(caps, gts, vocab)
    out: dict[str, Any] = {
        "recall": s["recall"],
        "precision": 1.0 - s["chair_i"] if s["n_mentions"] else 0.0,
        "chair_i": s["chair_i"],
        "chair_s": s["chair_s"],
        "mean_length": s["mean_length"],
        "n_mentions": s["n_mentions"],
        "n_hallucinated": s["n_hallucinated"],
    }
    if world:
        causes = dict.fromkeys(HALLUCINATION_CAUSES, 0)
        for pc, present in zip(s["per_caption"], objects):
            for _, name in pc["hallucinated"]:
                causes[hallucination_cause(name, set(present))] += 1
        total = sum(causes.values())
        for k, v in causes.items():
            out[f"halluc_{k}"] = v
            out[f"halluc_{k}_frac"] = v / total if total else 0.0
    return out
