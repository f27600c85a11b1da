"""POPE and CHAIR on a model: build the inputs (held-out notes or a user's files), generate, parse, score.

    res = evaluate_model("runs/sft/model", "runs/data/world", split="test")
    res["chair"]["chair_i"], res["pope"]["adversarial"]["f1"], res["causes"]["partner_frac"]
    adapter = load_eval_adapter("models/llava-1.5-7b-hf", dtype="bfloat16")
    res = run_pope_files(adapter, "pope_coco_adversarial.jsonl", "val2014")
    res = run_chair_files(adapter, "objects.json", "val2014", vocab="coco")

The model is any folder :func:`mm.model.adapter.load_adapter` takes (a NoteVLM, or a transformers
LLaVA / Qwen2-VL / Idefics3 ... with its processor); generation goes through the adapter (its chat
template, greedy, batched, KV cache: :func:`mm.eval.generate.adapter_generate`). The runners also
take a loaded model + processor, or an adapter as ``model`` (``processor=None``).

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
from mm.eval.generate import adapter_generate, note_images
from mm.eval.model_inputs import chair_items, pope_items
from mm.eval.pope import parse_answer, pope_scores
from mm.eval.pope_notes import pope_questions
from mm.model import NoteProcessor, NoteVLMForConditionalGeneration
from mm.model.adapter import VLMAdapter, load_adapter

FILES_CAPTION_PROMPT = "Please describe this image in detail."
"""Default CHAIR prompt on a user's images (the prompt of the CHAIR evaluations of LLaVA-style models)."""

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


def load_eval_adapter(
    model_dir: str | Path, *, device: str | None = None, dtype: str | None = None
) -> VLMAdapter:
    """Any model folder `load_adapter` takes, on ``device`` (default cuda when present), in eval mode."""
    d = Path(model_dir)
    if not (d / "config.json").is_file():
        raise UserError(
            f"--model {d}: no config.json there; pass a model folder: OUT/model of `mm train` / `rl dpo`, "
            "or a transformers image-text-to-text checkpoint folder with its processor"
        )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    adapter = load_adapter(Path(model_dir), device=device, dtype=dtype)
    adapter.model.eval()
    return adapter


def as_adapter(model: Any, processor: Any = None) -> VLMAdapter:
    """``model`` if it is an adapter, else the adapter of a loaded model + processor (on its device)."""
    if isinstance(model, VLMAdapter):
        return model
    return load_adapter(model, processor, device=next(model.parameters()).device)


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

    ``model``: a `VLMAdapter` (``processor=None``) or a loaded model with its ``processor``.

    Returns :func:`mm.eval.pope.pope_scores`' dict plus ``split``, ``n_questions`` and ``answers``
    (``[{"question_id", "text", "label"}]``).
    """

    questions, warns = pope_questions(notes, split=split, seed=seed, template=template)
    texts = adapter_generate(
        as_adapter(model, processor), [[Path(root) / q["image"]] for q in questions],
        [q["text"] for q in questions], batch_size=batch_size, max_new_tokens=max_new_tokens,
    )  # fmt: skip
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
    """CHAIR of one greedy caption per note, plus the cause split (``causes``; world vocabulary only).

    ``model``: a `VLMAdapter` (``processor=None``) or a loaded model with its ``processor``.
    """

    if vocab not in ("world", "coco"):
        raise UserError(f"vocab must be 'world' or 'coco', got {vocab!r}")
    caps = adapter_generate(
        as_adapter(model, processor), [note_images(n, root) for n in notes],
        [prompt or CAPTION_PROMPT] * len(notes), batch_size=batch_size, max_new_tokens=max_new_tokens,
    )  # fmt: skip
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


def run_pope_files(
    adapter: VLMAdapter,
    questions: str | Path,
    image_folder: str | Path | None = None,
    *,
    parser: str = "original",
    post_prompt: str = "",
    limit: int | None = None,
    batch_size: int = 64,
    max_new_tokens: int = 8,
) -> dict[str, Any]:
    """POPE scores of ``adapter``'s greedy answers to a POPE question file (images in ``image_folder``,
    default the file's folder). Each question's ``text`` + ``post_prompt`` is asked about its image.

    Returns :func:`mm.eval.pope.pope_scores`' dict plus ``n_questions`` and ``answers``
    (``[{"question_id", "image", "prompt", "text", "label"}]``, POPE's answer-file layout + the label).
    """
    items = pope_items(questions, image_folder, limit=limit)
    prompts = [it.question["text"] + post_prompt for it in items]
    texts = adapter_generate(
        adapter, [[it.image] for it in items], prompts, batch_size=batch_size,
        max_new_tokens=max_new_tokens, where=[it.where for it in items],
    )  # fmt: skip
    labels = {it.question["question_id"]: it.question["label"].strip().lower() for it in items}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = pope_scores(
            labels,
            {it.question["question_id"]: t for it, t in zip(items, texts)},
            parser=parser,
            units={it.question["question_id"]: it.question["image"] for it in items},  # resample images
        )
    res["n_questions"] = len(items)
    res["answers"] = [
        {"question_id": it.question["question_id"], "image": it.question["image"], "prompt": p, "text": t,
         "label": labels[it.question["question_id"]]}
        for it, p, t in zip(items, prompts, texts)
    ]  # fmt: skip
    return res


def run_chair_files(
    adapter: VLMAdapter,
    objects: str | Path,
    image_folder: str | Path | None = None,
    *,
    vocab: str = "coco",
    prompt: str = FILES_CAPTION_PROMPT,
    limit: int | None = None,
    batch_size: int = 64,
    max_new_tokens: int = 96,
) -> dict[str, Any]:
    """CHAIR of one greedy caption per image of an objects file (``{image_id: [objects]}`` or a COCO
    instances file; image files found by :func:`mm.eval.model_inputs.find_image` in ``image_folder``,
    default the file's folder), scored with the ``coco`` or ``world`` vocabulary."""
    if vocab not in ("world", "coco"):
        raise UserError(f"vocab must be 'world' or 'coco', got {vocab!r}")
    items = chair_items(objects, image_folder, limit=limit)
    caps = adapter_generate(
        adapter, [[it.image] for it in items], [prompt] * len(items), batch_size=batch_size,
        max_new_tokens=max_new_tokens, where=[it.where for it in items],
    )  # fmt: skip
    v = Vocabulary.world() if vocab == "world" else Vocabulary.coco()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = chair_scores(
            [{"image_id": it.image_id, "caption": c} for it, c in zip(items, caps)],
            {it.image_id: it.objects for it in items},
            v,
        )
    if vocab == "world":
        res["causes"] = cause_split_from_chair(res)
    return res


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

    ``model_dir`` is any folder :func:`load_eval_adapter` takes; an already loaded ``model`` (an adapter,
    or a model with its ``processor``) may be passed instead. The result also holds ``samples`` (the
    first 5 captions), ``warnings``, bootstrap intervals (``chair_intervals``,
    ``pope[split]["intervals"]``) and ``units`` (per-note CHAIR and per-image POPE sums,
    :mod:`mm.eval.bootstrap`, for paired intervals against another model); it is JSON-ready.
    """
    if model is None:
        model, processor = load_eval_adapter(model_dir), None
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
