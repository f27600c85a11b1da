"""Claim evals on a model: caption held-out notes and answer the claim questions, then score both.

    res = run_claims(adapter, notes, root, extractor=build_extractor("world"), splits=("adversarial",))

``adapter`` is any :class:`mm.model.adapter.VLMAdapter` (:func:`mm.model.adapter.load_adapter`: a NoteVLM
folder or a transformers image-text-to-text model). Captions: one greedy caption per note with
:data:`mm.data.prompts.CAPTION_PROMPT` over all its images. Questions: per image, asked about that image
alone, greedy, parsed by the POPE parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mm.data.images import open_rgb
from mm.data.prompts import CAPTION_PROMPT
from mm.eval.claims.extract import ClaimExtractor
from mm.eval.claims.generative import generative_scores
from mm.eval.claims.questions import ClaimQuestionConfig, build_claim_questions, discriminative_scores
from mm.eval.claims.truth import note_truth
from mm.eval.parallel import strided_map


def _generate(adapter: Any, samples: list[Any], batch_size: int, max_new_tokens: int) -> list[str]:
    """Greedy answers of ``samples``, each process its share under ``torchrun`` (all of them returned)."""

    def answer(items: Sequence[int]) -> list[str]:
        out: list[str] = []
        for i in range(0, len(items), batch_size):
            rows = [samples[j] for j in items[i : i + batch_size]]
            out += adapter.generate(rows, max_new_tokens=max_new_tokens)
        return out

    return strided_map(answer, len(samples))


def run_claims(
    adapter: Any,
    notes: Sequence[Any],
    root: str | Path,
    *,
    extractor: ClaimExtractor,
    categories: Sequence[str],
    splits: Sequence[str] = ("adversarial",),
    parser: str = "original",
    seed: int = 0,
    batch_size: int = 32,
    caption_tokens: int = 96,
    answer_tokens: int = 8,
) -> dict[str, Any]:
    """``generative`` (:func:`generative_scores`) and ``discriminative[split]`` (per kind) of the model."""
    from mm.model.adapter import Sample

    root = Path(root)
    images = {p: open_rgb(root / p) for n in notes for p in n.images}
    caps = _generate(
        adapter, [Sample(images=[images[p] for p in n.images], text=CAPTION_PROMPT) for n in notes],
        batch_size, caption_tokens,
    )  # fmt: skip
    unknown: set[str] = set()
    truths = {n.id: note_truth(n, extractor.vocabulary, unknown) for n in notes}
    warns = [
        f"ground-truth object(s) not in the {extractor.name} vocabulary, ignored: {sorted(unknown)[:10]}"
    ] * bool(unknown)
    gen = generative_scores([(n.id, c) for n, c in zip(notes, caps)], truths, extractor, seed=seed)
    per_image = {p: t for n in notes for p, t in zip(n.images, truths[n.id].images)}
    disc: dict[str, Any] = {}
    for split in splits:
        qs, w = build_claim_questions(
            per_image, ClaimQuestionConfig(split=split, seed=seed), categories=categories
        )
        warns += [f"{split}: {x}" for x in w]
        texts = _generate(
            adapter,
            [Sample(images=[images[q["image"]]], text=q["text"]) for q in qs],
            batch_size,
            answer_tokens,
        )
        disc[split] = discriminative_scores(
            qs, {q["question_id"]: t for q, t in zip(qs, texts)}, parser=parser
        )
    return {"generative": gen, "discriminative": disc, "n_notes": len(notes), "warnings": warns}
