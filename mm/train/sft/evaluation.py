"""Held-out evaluation during ``mm train``: teacher-forced caption loss, greedy captions scored with CHAIR
on the world vocabulary (:mod:`mm.train.caption_eval`), yes/no accuracy when questions are trained."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from mm.eval.generate import answer_questions, generate_captions
from mm.eval.pope import parse_vlmevalkit
from mm.train.caption_eval import caption_object_metrics
from mm.train.devices import to_device
from mm.train.sft.config import TrainConfig
from mm.train.sft_data import SampleSet, load_note_images, to_unit
from mm.train.tasks import build_samples


@dataclass
class EvalData:
    """Held-out notes: images, caption samples, object sets, yes/no questions."""

    images: list[torch.Tensor]
    """Per note uint8 (n, 3, S, S)."""
    captions: Any
    """SampleSet of the caption samples (teacher-forced loss)."""
    objects: list[set[str]]
    """Present categories per note."""
    questions: list[tuple[int, str, str]]
    """(note index, question, answer)."""


@torch.no_grad()
def evaluate(model: Any, processor: Any, data: EvalData, cfg: TrainConfig) -> dict[str, float]:
    """Caption loss, CHAIR / recall / precision of greedy captions, yes/no accuracy on held-out notes."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    total = count = 0.0
    n = len(data.captions)
    for start in range(0, n, cfg.eval.batch_size):
        b = to_device(data.captions.batch(range(start, min(n, start + cfg.eval.batch_size))), device)
        out = model(**b)
        tokens = int((b["labels"][:, 1:] != -100).sum())
        total += float(out.loss) * tokens
        count += tokens
    items = [to_unit(im) for im in data.images]
    caps = generate_captions(
        model, processor, items, cfg.tasks.caption_prompt, cfg.eval.batch_size, cfg.eval.max_new_tokens
    )
    metrics: dict[str, Any] = {"caption_loss": total / max(count, 1.0)}
    m = caption_object_metrics(caps, data.objects)
    metrics.update({k: v for k, v in m.items() if isinstance(v, (int, float))})
    if data.questions and "question" in cfg.tasks.kinds:
        qs = data.questions
        answers = answer_questions(
            model, processor, [items[i] for i, _, _ in qs], [q for _, q, _ in qs], cfg.eval.batch_size, 8
        )
        ok = [parse_vlmevalkit(a) == gold for a, (_, _, gold) in zip(answers, qs)]  # "no" or "A fork: no"
        metrics["yesno_acc"] = sum(ok) / len(ok)
    model.train(was)
    metrics["_captions"] = caps[:5]
    return metrics


def load_eval_data(notes: list[Any], root: Path, processor: Any, cfg: TrainConfig) -> EvalData:
    """Held-out notes of the eval split (first ``eval.notes``) in memory."""
    notes = notes[: cfg.eval.notes]
    if not notes:
        raise UserError(
            f"no notes in split {cfg.data.eval_split!r}; generate more notes or change data.eval_split"
        )
    images = load_note_images(
        notes, root, processor.image_size, resize=processor.resize, fill=processor.image_mean
    )
    caps = SampleSet(
        processor=processor,
        images=images,
        samples=build_samples(notes, kinds=("caption",), caption_prompt=cfg.tasks.caption_prompt),
    )
    questions = [(i, q.question, q.answer) for i, n in enumerate(notes) for q in n.questions]
    return EvalData(
        images=images,
        captions=caps,
        objects=[n.categories for n in notes],
        questions=questions[: cfg.eval.questions],
    )
