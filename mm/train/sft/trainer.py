"""``mm train``'s own part of the training skeleton (:mod:`mm.train.loop`): its batch and its loss.

Batch: the samples of ``(seed, step)`` (:func:`mm.train.common.batch_indices`, or length-grouped batches
with ``train.group_by_length``), this rank's contiguous shard. Loss: the answer tokens' cross-entropy
with the LM head on answer positions only (:func:`mm.train.sft.loss.answer_loss`), divided by the global
batch's (weighted) answer-token count / world, so the ranks' averaged gradient is the one-process one.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.config import to_dict
from mm.errors import UserError
from mm.train import common, loop
from mm.train.config import build_optimizer, param_groups
from mm.train.sft.config import TrainConfig
from mm.train.sft.evaluation import EvalData, evaluate, load_eval_data
from mm.train.sft.loss import (
    answer_loss,
    answer_token_divisor,
    batch_weights,
    colour_token_ids,
    mean_answer_tokens,
)
from mm.train.sft.model import build_model_and_processor, prepare_trainable, save_final
from mm.train.sft_data import SampleSet, load_note_images
from mm.train.tasks import build_samples

PLOT_KEYS = ["loss", "lr", "eval/caption_loss", "eval/recall", "eval/chair_i"]
"""Panels of OUT/curves.png."""


@dataclass
class TrainResult:
    """What a finished run reports."""

    step: int
    """Last optimizer step."""
    metrics: dict[str, Any]
    """Final held-out metrics."""
    seconds: float
    """Wall time of this process's training loop (evaluation included)."""
    trainable: dict[str, int]
    """Trainable parameters per part."""
    step_seconds: float
    """Mean seconds per optimizer step (evaluation excluded)."""


class SFTTrainer(loop.StepTrainer):
    """Answer-token cross-entropy on the samples of each step."""

    progress_keys = ("eval/recall",)

    def __init__(
        self, cfg: TrainConfig, model: Any, processor: Any, data: SampleSet, eval_data: EvalData,
        *, rank: int, world: int,
    ) -> None:  # fmt: skip
        self.cfg, self.model, self.processor, self.data, self.eval_data = (
            cfg,
            model,
            processor,
            data,
            eval_data,
        )
        self.rank, self.world = rank, world
        self.colour_ids = colour_token_ids(processor.tokenizer) if cfg.tasks.colour_weight != 1.0 else None
        self.grouped = None
        if cfg.train.group_by_length:
            lengths = [len(ids) for ids in data.input_ids]
            self.grouped = common.LengthGroupedBatches(lengths, cfg.train.batch_size, seed=cfg.train.seed)
            per_rank = mean_answer_tokens(data, cfg.tasks, self.colour_ids) * cfg.train.batch_size / world
            self.fixed_divisor = torch.tensor(per_rank)

    def batch(self, step: int) -> tuple[dict[str, Any], torch.Tensor | None, torch.Tensor]:
        """``(collated shard, per-sample weights or None, loss divisor)``."""
        run, tasks = self.cfg.train, self.cfg.tasks
        if self.grouped is None:
            idx = common.batch_indices(len(self.data), run.batch_size, seed=run.seed, step=step)
        else:
            idx = self.grouped.indices(step)
        shard = common.shard(idx, rank=self.rank, world_size=self.world)
        batch = self.data.batch(shard)
        weights = batch_weights(self.data, shard, batch["labels"], tasks, self.colour_ids)
        if self.grouped is None:
            divisor = answer_token_divisor(batch["labels"], self.world, weights)
        else:
            divisor = self.fixed_divisor
        return batch, weights, divisor

    def loss(
        self, batch: tuple[dict[str, Any], torch.Tensor | None, torch.Tensor]
    ) -> tuple[torch.Tensor, dict]:
        inputs, weights, divisor = batch
        return answer_loss(self.model, inputs, weights, divisor), {}

    def evaluate(self) -> dict[str, Any]:
        return evaluate(common.unwrap(self.model), self.processor, self.eval_data, self.cfg)


def train(
    cfg: TrainConfig,
    *,
    out_dir: str | Path,
    train_notes: list[Any],
    eval_notes: list[Any],
    root: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> TrainResult:
    """Train (resuming from ``out_dir/checkpoints``); writes metrics, plots, checkpoints and ``out/model``.

    ``train_notes`` / ``eval_notes`` are notes of the folder ``root`` (image paths relative to it).
    ``stop_after`` ends after that many steps without the final evaluation or save (simulates a kill).
    """
    out = Path(out_dir)
    rank, world = loop.setup(cfg.train, global_batch=cfg.train.batch_size)
    model, processor, origin = build_model_and_processor(cfg)
    model, trainable = prepare_trainable(model, cfg)
    samples = build_samples(
        train_notes, kinds=cfg.tasks.kinds, caption_prompt=cfg.tasks.caption_prompt,
        questions_per_note=cfg.tasks.questions_per_note, image_caption_prompt=cfg.tasks.image_caption_prompt,
        answer_style=cfg.tasks.answer_style, pope_questions_per_note=cfg.tasks.pope_questions_per_note,
        attribute_questions_per_note=cfg.tasks.attribute_questions_per_note,
        colour_answers_per_note=cfg.tasks.colour_answers_per_note,
        count_answers_per_note=cfg.tasks.count_answers_per_note, seed=cfg.train.seed,
    )  # fmt: skip
    images = load_note_images(
        train_notes, root, processor.image_size, resize=processor.resize, fill=processor.image_mean
    )
    train_data = SampleSet(processor=processor, images=images, samples=samples)
    eval_data = load_eval_data(eval_notes, Path(root), processor, cfg)
    if trainable["total"] == 0:
        raise UserError("nothing to train: every parameter is frozen")
    opt, sched = build_optimizer(param_groups(model, cfg.optim.weight_decay), cfg.optim, cfg.train.steps)
    trainer = SFTTrainer(cfg, model, processor, train_data, eval_data, rank=rank, world=world)
    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=cfg.train, out=out, config=to_dict(cfg),
        desc=cfg.train.stage + ("-lora" if cfg.lora.enabled else ""), plot_keys=PLOT_KEYS,
        eval_every=cfg.train.eval_every, grad_clip=cfg.optim.grad_clip, resume=resume,
        show_progress=show_progress, stop_after=stop_after,
    )  # fmt: skip
    metrics = dict(result.metrics)
    if not result.stopped:  # rank 0 writes OUT/model; every rank returns once it is there
        common.on_rank0(lambda: save_final(result.model, processor, out, lora=cfg.lora.enabled))
    if rank == 0 and not result.stopped:
        metrics["origin"] = origin
        metrics["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return TrainResult(
        step=result.step, metrics=metrics, seconds=result.seconds, trainable=trainable,
        step_seconds=result.step_seconds,
    )  # fmt: skip


def write_plots(out_dir: str | Path) -> Path:
    """curves.png: loss, lr, held-out caption loss, object recall, CHAIR_i against step."""
    recs = common.read_metrics(Path(out_dir) / "metrics.jsonl")
    return common.plot_metrics(recs, PLOT_KEYS, Path(out_dir) / "curves.png", title="mm train")
