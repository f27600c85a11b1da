"""``rl rm``: train a Bradley-Terry reward model (:mod:`rl.trainers.rm_model`) on preference pairs, on the
training skeleton (:mod:`mm.train.loop`).

A step takes ``data.batch_size`` pairs (seeded, epoch-wise), scores chosen and rejected rows in one
forward (:class:`rl.trainers.dpo_files.FilePairBatcher`: the model's chat template + each answer + eos),
and minimises :func:`rl.trainers.rm_model.bt_loss`. Logged per step: ``loss``, ``accuracy`` (share of
pairs with r_chosen > r_rejected), ``margin`` (mean r_chosen - r_rejected), ``reward_chosen``,
``reward_rejected``; on the held-out pairs every ``train.eval_every`` steps: ``eval/accuracy``,
``eval/loss``, ``eval/margin``. Writes OUT/model (+ OUT/adapter under LoRA), OUT/value_head.pt and
OUT/reward_model.json (``reward.source: rm:OUT`` in ``rl grpo`` reads them).

Under ``torchrun`` / ``accelerate launch`` each rank scores its shard of every step's pairs (the BT loss is
a mean over pairs, so the averaged gradient is the global batch's: ``data.batch_size`` must divide by the
processes), and with ``train.fsdp`` the LM's blocks are sharded; rank 0 evaluates the held-out pairs and
saves, under FSDP from the whole weights the loop gathered.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from mm.config import to_dict
from mm.errors import UserError
from mm.train import common, loop
from rl.pairs.importers import FilePair
from rl.trainers.common import make_optimizer, start_run
from rl.trainers.dpo_files import FilePairBatcher, prepare_model, save_model
from rl.trainers.rm_config import RMConfig
from rl.trainers.rm_model import RewardModel, bt_loss

RM_PLOT_KEYS = ["loss", "accuracy", "margin", "reward_chosen", "reward_rejected", "eval/accuracy"]
"""Panels of OUT/curves.png."""


def split_pairs(pairs: list[FilePair], heldout: float, seed: int) -> tuple[list[FilePair], list[FilePair]]:
    """``(train, held out)``: a seeded shuffle, the last ``max(1, round(heldout * n))`` held out (none
    when ``heldout`` is 0)."""
    if heldout <= 0:
        return list(pairs), []
    n_eval = max(1, round(heldout * len(pairs)))
    if n_eval >= len(pairs):
        raise UserError(f"data.heldout={heldout} leaves no training pairs out of {len(pairs)}; lower it")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    return [pairs[i] for i in order[:-n_eval]], [pairs[i] for i in order[-n_eval:]]


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """Accuracy, margin and mean rewards of ``(B,)`` chosen / rejected rewards."""
    diff = (chosen - rejected).detach()
    return {
        "accuracy": float((diff > 0).float().mean()),
        "margin": float(diff.mean()),
        "reward_chosen": float(chosen.detach().mean()),
        "reward_rejected": float(rejected.detach().mean()),
    }


class RMTrainer(loop.StepTrainer):
    """A step's batch: chosen + rejected rows of ``batch_size`` pairs; its loss: the BT loss."""

    progress_keys = ("accuracy",)

    def __init__(
        self, *, rm: RewardModel, train: FilePairBatcher, heldout: FilePairBatcher | None, batch_size: int,
        seed: int, center_weight: float, rank: int = 0, world: int = 1,
    ) -> None:  # fmt: skip
        self.model, self.train_pairs, self.heldout = rm, train, heldout
        self.batch_size, self.seed, self.center_weight = batch_size, seed, center_weight
        self.rank, self.world = rank, world

    def batch(self, step: int) -> dict[str, Any]:
        idx = common.batch_indices(len(self.train_pairs), self.batch_size, seed=self.seed, step=step)
        return self.train_pairs.batch(common.shard(idx, rank=self.rank, world_size=self.world))

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        b = batch["num_pairs"]
        r = self.model(batch)  # (2b,): chosen rows then rejected rows
        loss = bt_loss(r[:b], r[b:], center_weight=self.center_weight)
        return loss, {"loss": float(loss.detach()), **pair_metrics(r[:b], r[b:])}

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Held-out pair accuracy, BT loss and margin (eval mode)."""
        if self.heldout is None:
            return {}
        rm = self.model  # under FSDP the loop puts the gathered whole copy here for the evaluation
        was = rm.training
        rm.eval()
        chosen, rejected = [], []
        try:
            for i in range(0, len(self.heldout), self.batch_size):
                batch = self.heldout.batch(list(range(i, min(i + self.batch_size, len(self.heldout)))))
                b = batch["num_pairs"]
                r = rm(batch)  # (2b,)
                chosen.append(r[:b])
                rejected.append(r[b:])
        finally:
            rm.train(was)
        c, j = torch.cat(chosen), torch.cat(rejected)
        m = pair_metrics(c, j)
        return {"accuracy": m["accuracy"], "margin": m["margin"], "loss": float(bt_loss(c, j)),
                "pairs": len(c)}  # fmt: skip


def train(
    cfg: RMConfig,
    pairs: list[FilePair],
    *,
    out_dir: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train on ``pairs`` (:func:`rl.pairs.importers.read_pair_file`); writes OUT (see the module
    docstring). Returns a summary with the last held-out evaluation."""
    out, device = start_run(cfg.train, out_dir, global_batch=cfg.data.batch_size)
    rank, world = common.init_distributed()
    adapter = prepare_model(cfg, device)  # LoRA-wrapped, or all but the vision tower trainable
    rm = RewardModel(adapter=adapter)
    rm.train()
    train_pairs, held = split_pairs(pairs, cfg.data.heldout, cfg.train.seed)

    def batcher(ps: list[FilePair]) -> FilePairBatcher:
        return FilePairBatcher(adapter=adapter, pairs=ps, max_answer_tokens=cfg.data.max_answer_tokens)

    trainer = RMTrainer(
        rm=rm, train=batcher(train_pairs), heldout=batcher(held) if held else None,
        batch_size=cfg.data.batch_size, seed=cfg.train.seed, center_weight=cfg.loss.center_weight, rank=rank,
        world=world,
    )  # fmt: skip
    opt, sched = make_optimizer(rm, cfg.optim, cfg.train.steps)
    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=cfg.train, out=out, config=to_dict(cfg),
        desc=f"rm-{adapter.family}" + ("-lora" if cfg.lora.enabled else ""), plot_keys=RM_PLOT_KEYS,
        eval_every=cfg.train.eval_every if held else None, grad_clip=cfg.optim.grad_clip, resume=resume,
        show_progress=show_progress, stop_after=stop_after,
    )  # fmt: skip
    if not result.stopped:  # rank 0 writes OUT; every rank returns once it is there

        def save() -> None:
            final = result.model if isinstance(result.model, RewardModel) else rm  # FSDP: the gathered copy
            save_model(final.adapter, out)
            final.save_head(out)

        common.on_rank0(save)
    return {
        "step": result.step,
        "family": adapter.family,
        "pairs": len(train_pairs),
        "heldout_pairs": len(held),
        "heldout": result.metrics,
        "train_seconds": round(result.seconds, 3),
        "last": result.last,
    }
