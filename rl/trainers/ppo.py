"""PPO with a critic (``rl ppo``): per-token rewards, GAE, clipped policy and value losses.

One step (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", Algorithm 1; the RLHF form of
Ziegler et al. 2019 and InstructGPT, Ouyang et al. 2022):

1. sample ``group_size`` responses to each of ``prompts_per_step`` prompts with ``rl grpo``'s sampler and
   scene reward (:meth:`rl.trainers.grpo.GRPOTrainer._sample`); one forward gives the rollout's old
   log-probs and old values (:class:`rl.trainers.value_head.ActorCritic`);
2. per-token rewards (:func:`rl.trainers.ppo_math.token_rewards`): ``algo.mention_credit`` times the dense
   per-mention credit on the token that earned it (:meth:`GRPOTrainer.credits`), the response's reward on
   its last token, and with ``kl.mode: reward`` ``-algo.beta * kl_t`` to the reference on every token;
3. GAE (:func:`rl.advantages.gae`, ``ppo.gamma``, ``ppo.lam``) -> advantages and returns (value targets);
   advantages whitened over the batch's response tokens (:func:`rl.advantages.masked_whiten`);
4. ``ppo.epochs`` passes over the rollout in ``ppo.minibatches`` shuffled minibatches; each update minimises
   the clipped policy loss with ``rl grpo``'s entropy remedies (:func:`rl.trainers.grpo.grpo_loss`:
   ``algo.loss_mode`` clip / clip_cov / kl_cov, ``entropy_coef``, ``forking_top``, ``beta`` * KL with
   ``kl.mode: loss``) plus ``ppo.vf_coef`` times the clipped value loss (:func:`rl.losses.value_loss`,
   ``ppo.vf_clip``).

Deviations: the dense credit sits on the first token of the word that completed a mention (where the model
chose the word, :func:`rl.rewards.mention_credits`), not on its last token; the value loss is always
token-mean; the learning-rate schedule advances once per rollout step; the logged policy metrics are means
over the step's updates.

Data parallel (torchrun / accelerate launch, :mod:`rl.trainers.ppo_shard`): each rank samples whole groups
of the step's prompts with ``rl grpo``'s seeded sampler and runs GAE on its rows; advantages are whitened,
and the rollout means taken, over every rank's tokens; each update trains on the rank's rows of the one
process's minibatch, normalised by the minibatch's global counts, so N processes take one process's steps.
Only rank 0 writes. Under FSDP the final save is the gathered weights.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from mm.config import to_dict
from mm.data.format import read_notes
from mm.errors import UserError
from mm.train import common, loop
from mm.train.config import build_optimizer, param_groups
from rl.advantages import gae, masked_mean, masked_whiten
from rl.importance import truncated_is_weights
from rl.kl import kl_estimate
from rl.losses import value_loss
from rl.rewards import resolve_vocab
from rl.trainers import ppo_shard
from rl.trainers.common import Reference, load_policy, save_final, start_run, to_device
from rl.trainers.grpo import GRPOTrainer, grpo_loss
from rl.trainers.grpo_data import PromptSet
from rl.trainers.grpo_shard import step_metrics
from rl.trainers.monitor import failure_warnings
from rl.trainers.ppo_config import PPOConfig
from rl.trainers.ppo_math import explained_variance, minibatch_plan, token_rewards
from rl.trainers.ppo_shard import WHOLE, Shares
from rl.trainers.rewarders import build_rewarder
from rl.trainers.rm_model import hidden_size
from rl.trainers.value_head import ActorCritic, save_value_head, value_head

__all__ = ["PPOConfig", "PPOTrainer", "ppo_loss", "train"]

PPO_PLOT_KEYS = [
    "reward_mean", "kl", "entropy", "policy_loss", "value_loss", "explained_variance", "clip_frac_high",
    "approx_kl",
]  # fmt: skip
"""Panels of OUT/curves.png."""


def ppo_loss(
    model: ActorCritic,
    batch: dict[str, Any],
    cfg: PPOConfig,
    rows: torch.Tensor | slice = slice(None),
    *,
    shares: Shares = WHOLE,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one PPO update on ``rows`` of a prepared rollout ``batch`` (:meth:`PPOTrainer.batch`):
    ``grpo_loss`` (clipped policy loss, entropy remedies, KL with ``kl.mode: loss``) on the whitened GAE
    advantages plus ``vf_coef`` times the clipped value loss; and detached metrics. ``shares``: this rank's
    weights of the policy and value losses and of the metrics under data parallel
    (:func:`rl.trainers.ppo_shard.update_shares`; all 1 in one process)."""
    values: dict[str, torch.Tensor] = {}

    def scorer(m: ActorCritic, b: dict[str, torch.Tensor], **kw: Any) -> Any:
        logps, mask, entropy, values["v"] = m(b, **kw)  # (b, W) each
        return logps, mask, entropy

    def pick(key: str) -> Any:
        return None if batch[key] is None else batch[key][rows]

    mb = {k: v[rows] for k, v in batch["rows"].items()}
    pg, metrics = grpo_loss(
        model, mb, pick("adv"), cfg.loss_algo(), old_logps=pick("old"),
        ref_logps=pick("ref") if cfg.kl.mode == "loss" else None, temperature=cfg.rollout.temperature,
        horizon=cfg.rollout.max_new_tokens, is_weights=pick("weights"), scorer=scorer,
    )  # fmt: skip
    mask = mb["response_mask"][:, -values["v"].shape[1] :]  # (b, W)
    vl, vclip = value_loss(values["v"], pick("values"), pick("returns"), mask, clip_range=cfg.ppo.vf_clip)
    metrics.update(value_loss=vl.detach(), value_clip_frac=vclip)
    if shares != WHOLE:  # this rank's part of the global minibatch's averages
        # the policy loss by its normaliser; every other metric is a token mean (PPO's ratios are per token)
        metrics = {k: v * (shares.policy if k == "policy_loss" else shares.tokens)
                   for k, v in metrics.items()}  # fmt: skip
        pg, vl = pg * shares.policy, vl * shares.tokens
    return pg + cfg.ppo.vf_coef * vl, metrics


class PPOTrainer(GRPOTrainer):
    """A step's batch is a scored rollout with its GAE advantages and returns; its loss is
    :func:`ppo_loss` on one minibatch, ``ppo.epochs * ppo.minibatches`` updates per batch."""

    def __init__(
        self, cfg: PPOConfig, model: ActorCritic, ref: Reference, prompts: PromptSet, tok: Any,
        device: torch.device, rewarder: Any = None,
    ) -> None:  # fmt: skip
        super().__init__(cfg, model.policy, ref, prompts, tok, device, rewarder)  # the sampler's set-up
        self.model = model
        self.updates_per_step = cfg.ppo.epochs * cfg.ppo.minibatches
        self.plan: list[torch.Tensor] = []
        """This rank's row indices of each update of the current batch (:func:`rl.trainers.ppo_math.
        minibatch_plan` over the global rows, :func:`rl.trainers.ppo_shard.local_plan`)."""
        self.shares: list[Shares] = []
        """This rank's loss weights of each update (:func:`rl.trainers.ppo_shard.update_shares`)."""
        self.done = 0
        """Updates done on the current batch."""
        self.sums: dict[str, float] = {}
        """Sums of the per-update metrics of the current batch."""

    def batch(self, step: int) -> dict[str, Any]:
        """The rollout of ``step`` with old log-probs, old values, reference log-probs, per-token rewards,
        advantages, returns and the rollout metrics."""
        cfg, algo, ro, world = self.cfg, self.cfg.algo, self.cfg.rollout, self.world
        groups, rewards, comps = self._sample(step, 0)  # this rank's groups; (B, G) global rewards
        roll = groups[self.positions[0]][0]  # this rank's groups are slices of one rollout, in order
        scores = rewards[self.positions].reshape(-1).to(self.device)  # (n,) this rank's sequence rewards
        batch = to_device(roll.batch(), self.device)
        with torch.no_grad():
            old, mask, _, old_values = self.model(batch, temperature=ro.temperature)  # (n, W) each
            weights = None
            if roll.rollout_logps is not None:  # sampled off the trainer's distribution (rl.importance)
                mu = roll.rollout_logps.to(old.device)
                weights = truncated_is_weights(old, mu, mask, cap=ro.tis_cap, level=ro.tis_level)
            ref = self.ref.token_logps(batch, temperature=ro.temperature) if self.ref.kind != "none" else None
        credit = None
        if algo.mention_credit > 0:
            row_prompts = [p for g in groups if g is not None for p in g[2]]  # this rank's rows' prompts
            credit = self.credits(roll, row_prompts).to(self.device)  # (n, W)
        kl = None if ref is None else kl_estimate(old, ref, kind=algo.kl_estimator) * mask  # (n, W)
        shaping = algo.beta if cfg.kl.mode == "reward" else 0.0
        r = token_rewards(
            scores, mask, credits=None if credit is None else algo.mention_credit * credit, kl=kl,
            kl_coef=shaping,
        )  # fmt: skip
        adv, returns = gae(r, old_values, mask, gamma=cfg.ppo.gamma, lam=cfg.ppo.lam)  # (n, W) each
        if cfg.ppo.whiten_advantages:  # over every rank's tokens under data parallel (rl.trainers.ppo_shard)
            adv = masked_whiten(adv, mask) if world == 1 else ppo_shard.whiten(adv, mask, world=world)
        stats = dict(comps)
        n = len(roll.lengths)
        stats["response_len"] = (float(roll.lengths.sum()), n)
        stats["truncated_frac"] = (float(roll.truncated.sum()), n)
        if credit is not None:
            stats["mention_credit_abs"] = (float(credit.abs().sum()), n)
        metrics = step_metrics(
            rewards=rewards.reshape(-1), advantages=adv[mask.bool()].cpu(), sampled=[rewards],
            group_size=ro.group_size, stats=stats, weights=weights, mask=None if weights is None else mask,
            tis_cap=ro.tis_cap, world=world,
        )  # fmt: skip
        for key in ("zero_std_frac", "group_reward_std"):  # group statistics: PPO has no group baseline
            metrics.pop(key)
        rows = rewards.numel()  # the global batch's responses
        if world == 1:
            metrics.update(
                sampled_tokens=float(mask.sum()),
                token_reward_sum=float((r * mask).sum() / n),
                value_mean=float(masked_mean(old_values, mask)),
                return_mean=float(masked_mean(returns, mask)),
                explained_variance=explained_variance(old_values, returns, mask),
            )
            if kl is not None:
                metrics["kl"] = float(masked_mean(kl, mask))
        else:
            means = ppo_shard.rollout_means(
                values=old_values, returns=returns, adv=adv, rewards=r, mask=mask, kl=kl, rows=rows,
                world=world,
            )  # fmt: skip
            metrics.update(means)
        plan = minibatch_plan(
            rows, epochs=cfg.ppo.epochs, minibatches=cfg.ppo.minibatches,
            seed=cfg.train.seed * 1_000_003 + step,
        )  # fmt: skip
        lo = self.positions[0] * ro.group_size  # this rank's rows of the global rollout: lo .. lo + n - 1
        self.plan = ppo_shard.local_plan(plan, lo=lo, hi=lo + n)
        self.shares = ppo_shard.update_shares(self.plan, mask, agg=algo.agg, world=world)
        self.done, self.sums = 0, {}
        return {
            "rows": batch, "old": old, "values": old_values, "adv": adv, "returns": returns, "ref": ref,
            "weights": weights, "metrics": metrics,
        }  # fmt: skip

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        u = self.done % len(self.plan)
        rows, shares = self.plan[u], self.shares[u]
        if not rows.numel():  # this rank holds none of the minibatch: a stand-in row that weighs nothing
            rows, shares = torch.zeros(1, dtype=torch.long), Shares(0.0, 0.0)
        loss, m = ppo_loss(self.model, batch, self.cfg, rows.to(batch["adv"].device), shares=shares)
        self.done += 1
        for k, v in m.items():  # kl here only with kl.mode: loss; with reward it is the rollout's (batch)
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
        means = {k: s / self.done for k, s in self.sums.items()}  # over the step's updates so far
        return loss, {**batch["metrics"], **means}


def optimizer_groups(model: ActorCritic, cfg: PPOConfig) -> list[dict[str, Any]]:
    """AdamW groups: the policy's at ``optim.lr``, the head's and a separate critic's at
    ``optim.lr * ppo.critic_lr_scale`` (decay on matrices only, :func:`mm.train.config.param_groups`)."""
    critic = torch.nn.ModuleList([model.head] + ([model.critic] if model.critic is not None else []))
    fast = [
        {**g, "lr": cfg.optim.lr * cfg.ppo.critic_lr_scale}
        for g in param_groups(critic, cfg.optim.weight_decay)
    ]
    return param_groups(model.policy, cfg.optim.weight_decay) + fast


def train(
    cfg: PPOConfig,
    *,
    out_dir: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train; writes OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/, OUT/model and the value head
    (:func:`rl.trainers.value_head.save_value_head`). Returns a summary."""
    out, device = start_run(cfg.train, out_dir, global_batch=cfg.data.prompts_per_step)
    folder = Path(cfg.data.folder)
    if not (folder / "notes.jsonl").is_file():
        raise UserError(f"data.folder={folder} has no notes.jsonl; generate notes with `mm data world`")
    scene = cfg.reward.source == "scene"
    notes = [n for n in read_notes(folder, split=cfg.data.split) if n.categories or not scene]
    notes = notes[: cfg.data.notes] if cfg.data.notes else notes
    if not notes:
        raise UserError(f"data.folder={folder}: no {cfg.data.split!r} notes with object annotations")
    if "caption" in cfg.data.tasks:
        where = f"data.folder={folder} ({cfg.data.split})"
        vocab = resolve_vocab(cfg.reward.vocab, [n.categories for n in notes], where=where)
        cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, vocab=vocab))
    policy, processor = load_policy(cfg.init, cfg.lora, device)
    critic = load_policy(cfg.init, cfg.lora, device)[0] if cfg.critic == "separate" else None
    head = value_head(hidden_size(policy if critic is None else critic)).to(device)
    model = ActorCritic(policy=policy, head=head, critic=critic)
    ref = Reference(model=policy, needed=cfg.algo.beta > 0)
    prompts = PromptSet(processor=processor, notes=notes, root=folder, cfg=cfg.data)
    opt, sched = build_optimizer(optimizer_groups(model, cfg), cfg.optim, cfg.train.steps)
    rewarder = build_rewarder(
        cfg.reward, policy_folder=cfg.init.model, prompts=prompts, root=folder, device=device
    )
    trainer = PPOTrainer(cfg, model, ref, prompts, processor.tokenizer, device, rewarder)

    def monitor(history: list[dict[str, Any]], record: dict[str, Any]) -> list[str]:
        return failure_warnings(history, record, max_new_tokens=cfg.rollout.max_new_tokens)

    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=cfg.train, out=out, config=to_dict(cfg),
        desc=f"ppo-{cfg.critic}" + ("-lora" if cfg.lora.enabled else ""), plot_keys=PPO_PLOT_KEYS,
        monitor=monitor, grad_clip=cfg.optim.grad_clip, resume=resume, show_progress=show_progress,
        stop_after=stop_after,
    )  # fmt: skip
    if not result.stopped:  # rank 0 writes OUT; every rank returns once it is there

        def save() -> None:  # result.model: the whole weights under FSDP (on rank 0)
            save_final(result.model.policy, processor, out, lora=cfg.lora.enabled)
            save_value_head(result.model, processor, out, lora=cfg.lora.enabled)

        common.on_rank0(save)
    return {
        "step": result.step,
        "prompts": len(prompts),
        "critic": cfg.critic,
        "reference": ref.kind,
        "train_seconds": round(result.seconds, 3),
        "step_seconds": round(result.step_seconds, 4),
        "last": result.last,
    }
