"""POPE-style yes/no pairs (as in HA-DPO's and RLHF-V's object questions).

One image, "Is there a {object} in this note?", chosen = the right answer, rejected = the wrong one.
Negatives are POPE-adversarial by default (absent objects that co-occur most with the image's objects), so
the pairs push against exactly the "yes" a language prior gives to a missing knife next to a fork.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mm.data.prompts import WORLD_POPE_TEMPLATE
from mm.eval.pope_notes import pope_questions
from mm.train.tasks import yes_no_answer
from rl.pairs.record import PreferencePair


def question_pairs(
    notes: Sequence[Any],
    *,
    per_image: int = 1,
    split: str = "adversarial",
    seed: int = 0,
    template: str | None = None,
    answer_style: str = "word",
) -> list[PreferencePair]:
    """POPE-style yes/no pairs on single images of ``notes``: chosen = the right answer, rejected = the other.

    Per image, ``per_image`` present objects ("yes") and as many absent ones ("no"), the absent ones chosen
    by the POPE ``split`` rule (:func:`mm.eval.runners.pope_questions`: ``adversarial`` = the absent
    categories that co-occur most with the image's objects in ``notes``). The answers are written as the
    SFT model learned them, ``answer_style`` (:func:`mm.train.tasks.yes_no_answer`: "yes" or "A fork: yes"),
    so they are what the model already emits. Build them from training notes; the evaluation asks the same
    template on held-out notes.
    """
    if per_image < 1:
        raise ValueError(f"per_image must be >= 1, got {per_image}")
    note_of = {path: n for n in notes for path in n.images}
    questions, _ = pope_questions(notes, split=split, seed=seed, template=template or WORLD_POPE_TEMPLATE)
    taken: dict[tuple[str, str], int] = {}
    out = []
    for q in questions:
        key = (q["image"], q["label"])
        if taken.get(key, 0) >= per_image:
            continue
        taken[key] = taken.get(key, 0) + 1
        note = note_of[q["image"]]
        k = note.images.index(q["image"])
        wrong = "no" if q["label"] == "yes" else "yes"
        chosen, rejected = (yes_no_answer(x, q["object"], answer_style) for x in (q["label"], wrong))
        out.append(
            PreferencePair(
                id=f"{note.id}-question-{k}-{q['question_id']}",
                kind="question",
                note_id=note.id,
                images=[q["image"]],
                prompt=q["text"],
                chosen=chosen,
                rejected=rejected,
                objects=sorted({a.category for a in note.objects[k]}),
                chosen_reward=1.0,
                rejected_reward=0.0,
                meta={"object": q["object"], "label": q["label"], "split": split, "image_index": k},
            )
        )
    return out
