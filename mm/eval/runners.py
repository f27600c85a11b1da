"""POPE and CHAIR on a model: build the inputs from held-out notes, generate, parse, score.

    res = evaluate_model("runs/sft/model", "runs/data/world", split="test")
    res["chair"]["chair_i"], res["pope"]["adversarial"]["f1"], res["causes"]["partner_frac"]

- POPE (:func:`run_pope`): questions from the notes' object annotations with the POPE builder
  (:func:`mm.eval.pope.build_questions`), one set of yes/no pairs *per image*; each question is asked
  about that image alone (a one-image note), answered greedily (batched, KV cache:
  :func:`mm.eval.generate.answer_questions`), parsed and scored by :func:`mm.eval.pope.pope_scores`.
  Absent categories come from the whole world vocabulary (not only those seen in the held-out notes).
- CHAIR (:func:`run_chair`): one greedy caption per note (:func:`mm.eval.generate.generate_captions`,
  prompt :data:`mm.data.prompts.CAPTION_PROMPT`), scored against the note's categories with the world
  vocabulary (:func:`mm.eval.chair.chair_scores`), plus the hallucination cause split
  (:mod:`mm.eval.causes`).

Deviation from POPE: the default question template is :data:`WORLD_POPE_TEMPLATE` ("Is there a
{object} in this note?", with a/an fixed), the form the world's single-image notes are trained on;
pass ``template=mm.eval.pope.DEFAULT_TEMPLATE`` for POPE's exact wording.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mm.data.format import read_notes
from mm.data.prompts import CAPTION_PROMPT, WORLD_POPE_TEMPLATE
from mm.errors import UserError
from mm.eval.bootstrap import chair_units, pope_units
from mm.eval.causes import cause_split_from_chair
from mm.eval.chair import Vocabulary, chair_scores
from mm.eval.generate import answer_questions, generate_captions
from mm.eval.pope import parse_answer, pope_scores
from mm.eval.pope_notes import pope_questions
from mm.model import NoteProcessor, NoteVLMForConditionalGeneration

CHAIR_SUMMARY_KEYS = (
    "chair_i",
    "chair_s",
    "recall",
    "mean_length",
    "n_captions",
    "n_mentions",
    "n_hallucinated",
)
"""Keys of a CHAIR result kept in :func:`evaluate_model`'s summary."""


def load_model(model_dir: str | Path, *, device: str | None = None) -> tuple[Any, Any]:
    """A saved NoteVLM and its NoteProcessor (``mm train`` writes them to ``OUT/model``), in eval mode."""
    d = Path(model_dir)
    if not (d / "config.json").is_file():
        raise UserError(
            f"--model {d}: no config.json there; pass the folder `mm train` / `rl dpo` wrote (OUT/model)"
        )
    processor = NoteProcessor.from_pretrained(d)
    model = NoteVLMForConditionalGeneration.from_pretrained(str(d))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), processor


def held_out_notes(data_dir: str | Path, *, split: str = "test", limit: int | None = None) -> list[Any]:
    """Notes of ``split`` in ``data_dir`` that have object annotations (the first ``limit``)."""

    notes = [n for n in read_notes(data_dir, split=split) if n.categories]
    if not notes:
        raise UserError(
            f"--data {data_dir}: no {split!r} notes with object annotations; "
            "generate a world with held-out notes (`mm data world`) or choose another --eval-split"
        )
    return notes[:limit] if limit else notes


def run_pope(
    model: Any,
    processor: Any,
    notes: Sequence[Any],
    root: str | Path,
    *,
    split: str = "adversarial",
    parser: str = "original",
    seed: int = 0,
    template: str = WORLD_POPE_TEMPLATE,
    batch_size: int = 64,
    max_new_tokens: int = 8,
) -> dict[str, Any]:
    """POPE scores of ``model`` on per-image questions from ``notes`` (images resolved against ``root``).

    Returns :func:`mm.eval.pope.pope_scores`' dict plus ``split``, ``n_questions`` and ``answers``
    (``[{"question_id", "text", "label"}]``).
    """

    questions, warns = pope_questions(notes, split=split, seed=seed, template=template)
    items = [[str(Path(root) / q["image"])] for q in questions]
    texts = answer_questions(
        model, processor, items, [q["text"] for q in questions], batch_size, max_new_tokens
    )
    labels = {str(q["question_id"]): q["label"] for q in questions}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = pope_scores(
            labels,
            {str(q["question_id"]): t for q, t in zip(questions, texts)},
            parser=parser,
            units={str(q["question_id"]): q["image"] for q in questions},
        )
    res["warnings"] = warns + res["warnings"]
    res["units"] = pope_units(
        [(q["image"], q["label"], parse_answer(t, parser)) for q, t in zip(questions, texts)],
        unparsed_fn=parser != "lmms",
    )  # per image, for paired intervals
    res["split"] = split
    res["n_questions"] = len(questions)
    res["answers"] = [
        {"question_id": q["question_id"], "text": t, "label": q["label"]} for q, t in zip(questions, texts)
    ]
    return res


def run_chair(
    model: Any,
    processor: Any,
    notes: Sequence[Any],
    root: str | Path,
    *,
    prompt: str | None = None,
    batch_size: int = 64,
    max_new_tokens: int = 96,
    vocab: str = "world",
) -> dict[str, Any]:
    """CHAIR of one greedy caption per note, plus the cause split (``causes``; world vocabulary only)."""

    if vocab not in ("world", "coco"):
        raise UserError(f"vocab must be 'world' or 'coco', got {vocab!r}")
    caps = generate_captions(
        model, processor, list(notes), prompt or CAPTION_PROMPT, batch_size, max_new_tokens, root=root
    )
    v = Vocabulary.world() if vocab == "world" else Vocabulary.coco()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = chair_scores(
            [{"image_id": n.id, "caption": c} for n, c in zip(notes, caps)],
            {n.id: sorted(n.categories) for n in notes},
            v,
        )
    if vocab == "world":
        res["causes"] = cause_split_from_chair(res)
    return res


def claims_of_captions(per_caption: Sequence[dict[str, Any]], notes: Sequence[Any]) -> dict[str, Any]:
    """Generative claim scores (:mod:`mm.eval.claims`, world extractor) of CHAIR's captions of ``notes``."""
    from mm.eval.claims import build_extractor, generative_scores, note_truth

    ex = build_extractor("world")
    truth = {n.id: note_truth(n, ex.vocabulary) for n in notes}
    return generative_scores([(r["image_id"], r["caption"]) for r in per_caption], truth, ex)


def evaluate_model(
    model_dir: str | Path,
    data_dir: str | Path,
    *,
    split: str = "test",
    notes: int | None = 200,
    pope_splits: Sequence[str] = ("adversarial", "popular", "random"),
    parser: str = "original",
    seed: int = 0,
    template: str = WORLD_POPE_TEMPLATE,
    batch_size: int = 64,
    max_new_tokens: int = 96,
    model: Any = None,
    processor: Any = None,
) -> dict[str, Any]:
    """CHAIR (``chair``: chair_i, chair_s, recall, mean_length, counts), POPE per split (``pope``), the
    hallucination cause split (``causes``) and the claim rates of the same captions (``claims``: per
    kind, :func:`mm.eval.claims.generative_scores`) of the model in ``model_dir`` on ``notes`` held-out notes.

    An already loaded ``model``/``processor`` may be passed instead of loading ``model_dir``. The
    result also holds ``samples`` (the first 5 captions), ``warnings``, bootstrap intervals
    (``chair_intervals``, ``pope[split]["intervals"]``) and ``units`` (per-note CHAIR and per-image POPE
    sums, :mod:`mm.eval.bootstrap`, for paired intervals against another model); it is JSON-ready.
    """
    if model is None or processor is None:
        model, processor = load_model(model_dir)
    held = held_out_notes(data_dir, split=split, limit=notes)
    chair = run_chair(model, processor, held, data_dir, batch_size=batch_size, max_new_tokens=max_new_tokens)
    out: dict[str, Any] = {
        "model": str(model_dir),
        "data": str(data_dir),
        "split": split,
        "n_notes": len(held),
        "chair": {k: chair[k] for k in CHAIR_SUMMARY_KEYS},
        "chair_intervals": chair["intervals"],
        "units": {"chair": chair_units(chair["per_caption"])},
        "causes": chair["causes"],
        "pope": {},
        "samples": [
            {"id": r["image_id"], "caption": r["caption"], "hallucinated": [c for _, c in r["hallucinated"]]}
            for r in chair["per_caption"][:5]
        ],
        "warnings": list(chair["warnings"]),
    }
    claims = claims_of_captions(chair["per_caption"], held)
    out["claims"] = claims["kinds"]
    out["units"].update({f"claims_{k}": u for k, u in claims["units"].items()})
    for s in pope_splits:
        res = run_pope(
            model, processor, held, data_dir, split=s, parser=parser, seed=seed, template=template,
            batch_size=batch_size,
        )  # fmt: skip
        drop = ("answers", "missing_ids", "warnings", "units")
        out["pope"][s] = {k: v for k, v in res.items() if k not in drop}
        out["units"][f"pope_{s}"] = res["units"]
        out["warnings"] += [f"pope {s}: {w}" for w in res["warnings"]]
    return out
