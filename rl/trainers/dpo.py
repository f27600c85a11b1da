"""DPO-family post-training of a NoteVLM from its SFT checkpoint (``rl dpo``), with mDPO's terms.

Objective per pair (Rafailov et al. 2023, "Direct Preference Optimization"; the loss family and its
deviations are in :func:`rl.losses.dpo_loss`)::

    loss = dpo(loss_type, beta)  [+ sft_weight * NLL(chosen)  (RPO)]
         + conditional_weight * mDPO conditional term   (same chosen answer, corrupted image rejected)
         + anchor_weight * mDPO anchor term             (Wang et al. 2024, eqs. 4-5)

Why a compact loop and not TRL's ``DPOTrainer``: TRL 1.16 tokenises with ``processor(images=...,
text=...)`` and a chat template, flattens ``pixel_values`` per image and has no notion of NoteVLM's
``(B, N, 3, S, S)`` + ``image_mask`` layout or of corrupted-image rows for mDPO's conditional term; it
also re-tokenises text, while on-policy pairs here carry raw sampled ids. So this module builds the
rows itself (chosen, rejected and, for mDPO, chosen-with-corrupted-images concatenated into one
forward, as TRL's ``concatenated_forward``) and calls :func:`rl.losses.dpo_loss`. The step
(:func:`dpo_step`) also takes a text-only causal LM batch (no ``pixel_values``), which is how
``benchmarks/rl_bench.py`` times it against ``DPOTrainer``.

Scoring: the trainer takes the policy's and the reference's per-token log-probs through the model adapter
(:class:`rl.trainers.dpo_score.AdapterScorer` over :class:`mm.model.adapter.VLMAdapter`), the same
path ``rl dpo --model DIR --pairs FILE`` (:mod:`rl.trainers.dpo_files`) takes for any transformers VLM;
on NoteVLM rows it equals the direct model call (:func:`dpo_step`), which the text-only benchmark uses.

Reference: adapter-disabled model under LoRA, a frozen copy otherwise (DPO always needs one).
Data parallel (torchrun / accelerate launch): each rank takes its contiguous shard of every step's pairs
(:func:`mm.train.common.shard`); the loss is the shard's mean, so the ranks' averaged gradient
(:func:`mm.train.loop.average_gradients`) is the global batch's; BCO's running mean uses the global
mean of the implicit rewards. Only rank 0 writes.
Deviation: corrupt pairs (and mDPO's conditional rows) corrupt the images *after* resizing to the
processor's size (``rl.pairs.pair_images`` corrupts full-size files); same corruption kind and seed.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from mm.config import to_dict
from mm.errors import UserError
from mm.model.adapter import load_adapter
from mm.train import common, loop
from rl.losses import bco_running_delta, dpo_loss, mdpo_anchor_loss, mdpo_conditional_loss
from rl.trainers.common import (
    Reference,
    load_policy,
    make_optimizer,
    save_final,
    start_run,
    to_device,
)
from rl.trainers.dpo_config import BUILDS, DataConfig, DPOConfig, LossConfig
from rl.trainers.dpo_data import PairBatcher, load_pairs, load_question_pairs
from rl.trainers.dpo_score import AdapterScorer, ModelScorer, Scorer
from rl.trainers.monitor import failure_warnings

__all__ = [
    "BUILDS", "DPOConfig", "DPOTrainer", "DataConfig", "LossConfig", "PairBatcher", "dpo_step", "load_pairs",
    "load_question_pairs", "scored_dpo_step", "train",
]  # fmt: skip

DPO_PLOT_KEYS = ["loss", "reward_margin", "reward_accuracy", "grad_norm", "kl", "entropy"]
"""Panels of OUT/curves.png."""


QUESTION_METRICS = ("dpo_loss", "reward_accuracy", "reward_margin", "logp_chosen")
"""What the yes/no question batch (``data.question_batch_size``) logs, as ``question/<name>``."""


def dpo_step(
    model: Any,
    ref: Reference,
    batch: dict[str, Any],
    cfg: LossConfig,
    *,
    bco_delta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`scored_dpo_step` on a bare model (NoteVLM batches, or text-only causal LM batches without
    ``pixel_values``)."""
    return scored_dpo_step(ModelScorer(model, ref), batch, cfg, bco_delta=bco_delta)


def scored_dpo_step(
    scorer: Scorer,
    batch: dict[str, Any],
    cfg: LossConfig,
    *,
    bco_delta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss (scalar, with grad) and detached metrics of one batch of pairs.

    ``batch``: rows ``[0, b)`` chosen, ``[b, 2b)`` rejected and, with mDPO's conditional term,
    ``[2b, 3b)`` the chosen answer with corrupted images; ``num_pairs`` = b (see :class:`PairBatcher`
    and :class:`rl.trainers.dpo_files.FilePairBatcher`). ``scorer``: :mod:`rl.trainers.dpo_score`.
    """
    b = int(batch["num_pairs"])
    logps, mask, entropy = scorer.policy(batch)  # (R, W)
    ref_logps = scorer.reference(batch)  # (R, W)
    seq, ref_seq = logps.sum(-1), ref_logps.sum(-1)  # (R,)
    lengths = mask.sum(-1)  # (R,)
    losses, chosen_r, rejected_r = dpo_loss(
        seq[:b], seq[b : 2 * b], ref_seq[:b], ref_seq[b : 2 * b],
        loss_type=cfg.loss_type, beta=cfg.beta, label_smoothing=cfg.label_smoothing,
        chosen_lengths=lengths[:b], rejected_lengths=lengths[b : 2 * b], bco_delta=bco_delta,
        sft_weight=cfg.sft_weight,
    )  # fmt: skip
    loss = losses.mean()
    metrics: dict[str, torch.Tensor] = {"dpo_loss": loss.detach()}
    if cfg.conditional_weight > 0:
        cond = mdpo_conditional_loss(
            seq[:b], ref_seq[:b], seq[2 * b :], ref_seq[2 * b :], beta=cfg.beta
        ).mean()
        loss = loss + cfg.conditional_weight * cond
        metrics["conditional_loss"] = cond.detach()
    if cfg.anchor_weight > 0:
        anchor = mdpo_anchor_loss(seq[:b], ref_seq[:b], beta=cfg.beta, delta=cfg.anchor_delta).mean()
        loss = loss + cfg.anchor_weight * anchor
        metrics["anchor_loss"] = anchor.detach()
    with torch.no_grad():
        m = mask[: 2 * b].to(logps.dtype)
        margin = chosen_r - rejected_r
        implicit = torch.cat([chosen_r, rejected_r])
        metrics.update(
            {
                "reward_chosen": chosen_r.mean(),
                "reward_rejected": rejected_r.mean(),
                "reward_margin": margin.mean(),
                "reward_accuracy": (margin > 0).float().mean(),
                "reward_mean": implicit.mean(),
                "reward_std": _std_over_ranks(implicit),
                "logp_chosen": (seq[:b] / lengths[:b].clamp(min=1)).mean(),
                "logp_rejected": (seq[b : 2 * b] / lengths[b : 2 * b].clamp(min=1)).mean(),
                "kl": _token_mean_over_ranks((logps - ref_logps)[: 2 * b], m),
                "entropy": _token_mean_over_ranks(entropy[: 2 * b], m),
                "response_len": lengths[: 2 * b].float().mean(),
            }
        )
    return loss, metrics


def _summed(*values: torch.Tensor) -> torch.Tensor:
    """``values`` (scalars) summed over the ranks in one all-reduce (as they are in one process)."""
    return common.all_reduce_sum(torch.stack([v.detach().double() for v in values]))


def _std_over_ranks(x: torch.Tensor) -> torch.Tensor:
    """The unbiased std of ``x`` (N,) over every rank's values: under data parallel each rank's metrics are
    averaged by the loop, which is exact for means over equal shards but not for a spread."""
    n, total, squares = _summed(x.new_tensor(float(x.numel())), x.sum(), x.pow(2).sum())
    if n < 2:
        return x.new_zeros(())
    mean = total / n
    return ((squares - n * mean**2).clamp(min=0) / (n - 1)).sqrt().to(x.dtype)


def _token_mean_over_ranks(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` (R, W) over the tokens ``m`` marks on every rank (a token mean, not a mean of ranks')."""
    total, count = _summed((x * m).sum(), m.sum())
    return (total / count.clamp(min=1)).to(x.dtype)


# ---------------------------------------------------------------- training


class DPOTrainer(loop.StepTrainer):
    """The pairs of each step (this rank's shard) through :func:`scored_dpo_step`, plus the yes/no
    question batch when there is one. Any batcher with ``len()`` and ``batch(indices)`` serves."""

    def __init__(
        self, *, model: Any, scorer: Scorer, loss: LossConfig, pairs: Any, batch_size: int, seed: int,
        questions: Any = None, question_batch_size: int = 0, device: torch.device, rank: int, world: int,
    ) -> None:  # fmt: skip
        self.model, self.scorer, self.loss_cfg = model, scorer, loss
        self.pairs, self.questions = pairs, questions
        self.batch_size, self.question_batch_size, self.seed = batch_size, question_batch_size, seed
        self.device, self.rank, self.world = device, rank, world
        # the question pairs have no corrupted-image rows: no mDPO conditional term on them
        self.question_loss = dataclasses.replace(loss, conditional_weight=0.0)
        self.bco = {"bco_mean": 0.0, "bco_count": 0}

    def _rows(self, batcher: Any, size: int, seed: int, step: int) -> tuple[dict[str, Any], int]:
        idx = common.batch_indices(len(batcher), size, seed=seed, step=step)
        shard = common.shard(idx, rank=self.rank, world_size=self.world)
        return to_device(batcher.batch(shard), self.device), len(idx)

    def batch(self, step: int) -> dict[str, Any]:
        out = {"pairs": self._rows(self.pairs, self.batch_size, self.seed, step)}
        if self.questions is not None:
            out["questions"] = self._rows(self.questions, self.question_batch_size, self.seed + 1, step)
        return out

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        rows, size = batch["pairs"]
        loss, metrics = scored_dpo_step(self.scorer, rows, self.loss_cfg, bco_delta=self.bco["bco_mean"])
        if "questions" in batch:
            qloss, qm = scored_dpo_step(self.scorer, batch["questions"][0], self.question_loss)
            loss = loss + qloss
            metrics.update({f"question/{k}": qm[k] for k in QUESTION_METRICS})
        if self.loss_cfg.loss_type == "bco_pair":  # the running mean of the global batch's rewards
            chosen = common.all_reduce_sum(metrics["reward_chosen"]) / self.world
            rejected = common.all_reduce_sum(metrics["reward_rejected"]) / self.world
            self.bco["bco_mean"], self.bco["bco_count"] = bco_running_delta(
                self.bco["bco_mean"], self.bco["bco_count"], chosen.expand(size), rejected.expand(size)
            )
        return loss, metrics

    def state(self) -> dict[str, Any]:
        return dict(self.bco)

    def load_state(self, state: dict[str, Any]) -> None:
        self.bco.update(state)


def train(
    cfg: DPOConfig,
    *,
    out_dir: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train; writes OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/, OUT/model. Returns a summary."""
    out, device = start_run(cfg.train, out_dir, global_batch=cfg.data.batch_size)
    rank, world = common.init_distributed()
    if cfg.data.question_batch_size % world:
        raise UserError(
            f"data.question_batch_size={cfg.data.question_batch_size} must be divisible by {world} processes"
        )
    model, processor = load_policy(cfg.init, cfg.lora, device)
    pairs = load_pairs(cfg.data, cfg.train.seed, policy=(model, processor))
    adapter = load_adapter(model, processor, device=device)  # a PeftModel is kept as it is
    ref = Reference(model=adapter.model, needed=True)
    conditional = cfg.loss.corruption if cfg.loss.conditional_weight > 0 else None
    batcher = PairBatcher(
        processor=processor, pairs=pairs, root=cfg.data.folder, conditional=conditional, seed=cfg.train.seed
    )
    questions = None
    if cfg.data.question_batch_size:
        qpairs = load_question_pairs(cfg.data, cfg.train.seed)
        questions = PairBatcher(processor=processor, pairs=qpairs, root=cfg.data.folder, seed=cfg.train.seed)
    opt, sched = make_optimizer(model, cfg.optim, cfg.train.steps)
    trainer = DPOTrainer(
        model=adapter.model, scorer=AdapterScorer(adapter, ref), loss=cfg.loss, pairs=batcher,
        batch_size=cfg.data.batch_size, seed=cfg.train.seed, questions=questions,
        question_batch_size=cfg.data.question_batch_size, device=device, rank=rank, world=world,
    )  # fmt: skip
    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=cfg.train, out=out, config=to_dict(cfg),
        desc="dpo" + ("-lora" if cfg.lora.enabled else ""), plot_keys=DPO_PLOT_KEYS, monitor=failure_warnings,
        grad_clip=cfg.optim.grad_clip, resume=resume, show_progress=show_progress, stop_after=stop_after,
    )  # fmt: skip
    if not result.stopped:  # rank 0 writes OUT; every rank returns once it is there
        common.on_rank0(lambda: save_final(result.model, processor, out, lora=cfg.lora.enabled))
    return {
        "step": result.step,
        "pairs": len(pairs),
        "pair_kinds": dict(sorted(Counter(pr.kind for pr in pairs).items())),
        "question_pairs": 0 if questions is None else len(questions),
        "reference": ref.kind,
        "train_seconds": round(result.seconds, 3),
        "step_seconds": round(result.step_seconds, 4),
        "last": result.last,
    }
