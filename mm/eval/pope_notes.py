"""POPE questions over notes: the POPE builder (:func:`mm.eval.pope.build_questions`) on the notes' object
annotations, one set of yes/no pairs per image, worded with :data:`mm.data.prompts.WORLD_POPE_TEMPLATE`
(a/an fixed) by default. Used by the POPE evaluation (:mod:`mm.eval.runners`), the SFT ``pope_question``
samples (:mod:`mm.train.tasks`) and the yes/no preference pairs (:mod:`rl.pairs`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mm.data.prompts import WORLD_POPE_TEMPLATE
from mm.errors import UserError
from mm.eval.pope import PopeBuildConfig, build_questions, objects_from_notes
from mm.world.text import article
from mm.world.vocab import CATEGORY_NAMES


def _with_article(text: str, obj: str) -> str:
    return text.replace(f" a {obj}", f" {article(obj)} {obj}", 1)


def pope_questions(
    notes: Sequence[Any],
    *,
    split: str = "adversarial",
    seed: int = 0,
    template: str = WORLD_POPE_TEMPLATE,
    categories: Sequence[str] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """POPE questions (``question_id``, ``image``, ``text``, ``label``, ``object``) for the notes' images,
    and the builder's warnings. ``categories`` default to the world vocabulary."""
    if categories is None:
        categories = CATEGORY_NAMES
    try:
        cfg = PopeBuildConfig(split=split, seed=seed, template=template)
    except ValueError as e:
        raise UserError(f"POPE: {e}") from None
    objects = objects_from_notes(notes)
    try:
        questions, warns = build_questions(objects, cfg, categories=categories)
    except ValueError as e:
        raise UserError(f"POPE: {e}; pass --vocab/categories that cover the notes' objects") from None
    prefix, suffix = template.split("{object}", 1)
    for q in questions:
        q["object"] = q["text"][len(prefix) : len(q["text"]) - len(suffix)]
        q["text"] = _with_article(q["text"], q["object"])
    return questions, warns
