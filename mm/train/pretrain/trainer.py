"""``mm pretrain``'s own part of the training skeleton (:mod:`mm.train.loop`): its batch, its loss, its
held-out retrieval evaluation.

Batch: the notes of ``(seed, step)`` (:func:`mm.train.common.batch_indices`), this rank's contiguous shard.
Loss: ``contrastive_weight * contrastive + tag_weight * tags``; under DDP the features of every rank are
gathered with gradients, so each rank's loss is the global batch's and the averaged gradient equals the
one-process gradient on the global batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mm import contrastive
from mm.config import to_dict
from mm.errors import UserError
from mm.eval.retrieval import retrieval_metrics
from mm.train import common, loop
from mm.train.config import build_optimizer
from mm.train.devices import to_device
from mm.train.pretrain.config import PretrainConfig
from mm.train.pretrain.data import NoteTensors
from mm.train.pretrain.model import NoteTextModel, contrastive_loss, scoped_tag_loss

PLOT_KEYS = ["loss", "temperature", "eval/text2note_R@1", "eval/note2text_R@1"]
"""Panels of OUT/curves.png."""


@dataclass
class TrainResult:
    """What a finished (or resumed-and-finished) run reports."""

    step: int
    """Last optimizer step."""
    metrics: dict[str, float]
    """Final retrieval metrics on the held-out notes."""
    seconds: float
    """Wall time of this process's training (excluding data loading)."""
    cpu_seconds: float = 0.0
    """CPU time (all threads) of this process's training (excluding data loading)."""


class PretrainTrainer(loop.StepTrainer):
    """Contrastive (+ object tag) loss on the notes of each step."""

    progress_keys = ("temperature", "eval/text2note_R@1")

    def __init__(
        self, cfg: PretrainConfig, model: NoteTextModel, train_data: NoteTensors, eval_data: NoteTensors,
        *, rank: int, world: int,
    ) -> None:  # fmt: skip
        self.cfg, self.model, self.train_data, self.eval_data = cfg, model, train_data, eval_data
        self.rank, self.world = rank, world
        self.tags = model.tag_head is not None

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        run = self.cfg.train
        idx = common.batch_indices(len(self.train_data), run.batch_size, seed=run.seed, step=step)
        return self.train_data.batch(common.shard(idx, rank=self.rank, world_size=self.world))

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg, model = self.cfg.loss, self.model
        feats = model(batch)
        c_loss = contrastive_loss(
            feats, batch["image_mask"], log_scale=model.log_scale, logit_bias=model.logit_bias, cfg=cfg
        )
        loss = cfg.contrastive_weight * c_loss
        if not self.tags:
            return loss, {}
        images = common.all_reduce_sum(batch["image_mask"].sum().to(torch.float32)) / self.world  # (N / W)
        t_loss = scoped_tag_loss(
            feats["tag_logits"], batch["tags"], batch["image_mask"], cfg.tag_scope, count=images
        )
        loss = loss + cfg.tag_weight * t_loss
        return loss, {"tag_loss": t_loss.detach(), "contrastive_loss": c_loss.detach()}

    def after_update(self) -> None:
        if isinstance(self.model.log_scale, nn.Parameter):
            contrastive.clamp_logit_scale_(self.model.log_scale)

    def step_metrics(self) -> dict[str, float]:
        s = self.model.log_scale.item()
        return {"temperature": math.exp(-s), "logit_scale": math.exp(s)}

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.model, self.eval_data)


@torch.no_grad()
def embed_split(
    model: NoteTextModel, data: NoteTensors, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Note and text embeddings (M, E) of a whole split, in eval mode."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    notes, texts = [], []
    for start in range(0, len(data), batch_size):
        b = to_device(data.batch(list(range(start, min(len(data), start + batch_size)))), device)
        out = model(b)
        notes.append(out["note"])
        texts.append(out["text"])
    model.train(was)
    return torch.cat(notes), torch.cat(texts)


def evaluate(model: NoteTextModel, data: NoteTensors) -> dict[str, float]:
    """R@1/5/10 note->text and text->note on ``data``."""
    notes, texts = embed_split(model, data)
    return retrieval_metrics(notes, texts)


def train(
    cfg: PretrainConfig,
    *,
    out_dir: str | Path,
    train_data: NoteTensors,
    eval_data: NoteTensors,
    vocab_size: int,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> TrainResult:
    """Train (resuming from ``out_dir/checkpoints`` when ``resume``); writes metrics, plots, checkpoints.

    ``stop_after`` ends the process after that many steps without a final evaluation (simulates a kill,
    for tests); the checkpoint cadence is unchanged.
    """
    rank, world = loop.setup(cfg.train, global_batch=cfg.train.batch_size)
    num_tags = 0
    if cfg.loss.tag_weight > 0:
        if train_data.tags is None:
            raise UserError("loss.tag_weight > 0 needs object tags: load the data with tag_classes")
        num_tags = int(train_data.tags.shape[-1])
    model = NoteTextModel(cfg=cfg.model, loss=cfg.loss, vocab_size=vocab_size, num_tags=num_tags)
    groups = contrastive.param_groups(model, weight_decay=cfg.optim.weight_decay)
    opt, sched = build_optimizer(groups, cfg.optim, cfg.train.steps)
    trainer = PretrainTrainer(cfg, model, train_data, eval_data, rank=rank, world=world)
    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=cfg.train, out=Path(out_dir), config=to_dict(cfg),
        desc="pretrain", plot_keys=PLOT_KEYS, eval_every=cfg.train.eval_every, grad_clip=cfg.optim.grad_clip,
        resume=resume, show_progress=show_progress, stop_after=stop_after,
    )  # fmt: skip
    return TrainResult(
        step=result.step, metrics=result.metrics, seconds=result.seconds, cpu_seconds=result.cpu_seconds
    )


def write_plots(out_dir: str | Path) -> Path:
    """curves.png: loss, temperature and text->note / note->text R@1 against step."""
    recs = common.read_metrics(Path(out_dir) / "metrics.jsonl")
    return common.plot_metrics(recs, PLOT_KEYS, Path(out_dir) / "curves.png", title="pretrain")
