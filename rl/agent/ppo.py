"""Multi-turn PPO with a critic for ``rl agent``: GAE over the policy's own tokens, observations skipped.

One step (Schulman et al. 2017, Algorithm 1, on whole trajectories as verl's multi-turn PPO):

1. roll out ``samples_per_task`` trajectories for each of ``tasks_per_step`` tasks (the loop, tools and
   simulated user of GRPO; the same sampling and trajectory reward);
2. one forward over the concatenated ids gives the old values ``V(s_t) = head(h_{t-1})`` of every policy
   token (:meth:`mm.model.adapter.base.VLMAdapter.token_logps_states`; the old log-probs are the ones
   recorded while sampling);
3. the trajectory reward sits on its last policy token (:func:`rl.trainers.ppo_math.token_rewards`); GAE
   (:func:`rl.advantages.gae`) runs over the policy tokens only: an observation or user span between two
   turns is skipped, so the last token of a turn bootstraps from the value of the first token of the next
   turn, which has read the observation. Advantages are whitened over the batch's policy tokens;
4. ``epochs`` passes in ``minibatches`` shuffled slices of trajectories, each minimising the clipped
   policy loss (:func:`rl.losses.policy_loss`) plus ``vf_coef`` times the clipped value loss
   (:func:`rl.losses.value_loss`), both on policy tokens only: prompts, observations and user messages get
   exactly zero gradient from either term.

``micro_batch_size`` runs both the value pass of step 2 and each update a few trajectories at a time: the
values are the same, and each micro-batch's policy and value losses are weighted by its share of the
minibatch's normaliser (tokens, or sequences for the ``seq-mean-*`` aggregations, whose horizon stays the
minibatch's), so the accumulated gradient is the minibatch's (tested against one pass).

The critic is a value head on the policy's trunk (``shared`` in ``rl ppo``), trained at ``lr *
critic_lr_scale``. Saved as ``OUT/ppo/model.pt`` (the policy's state dict) and ``OUT/ppo/value_head.pt``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.train.loop import average_gradients
from mm.train.metrics import MetricsLogger, read_metrics
from rl.advantages import gae, masked_mean, masked_whiten
from rl.agent.backend import AgentBackend
from rl.agent.config import AgentPPOConfig, AgentRunConfig
from rl.agent.loop import trajectory_batch
from rl.agent.micro import micro_batches
from rl.agent.parallel import barrier, check_in_sync, gathered, is_writer, most, rank_world, total
from rl.agent.stages import (
    build_backend,
    load_checkpoint,
    loop_config,
    prepare_steps,
    reward_fn,
    rollout_summary,
    save_checkpoint,
    save_weights,
    step_rollout,
    step_seed,
    train_tasks,
)
from rl.agent.trajectory import Trajectory
from rl.losses import policy_loss, value_loss
from rl.trainers.grpo_shard import global_moments
from rl.trainers.ppo_math import explained_variance, minibatch_plan, token_rewards
from rl.trainers.ppo_shard import local_plan
from rl.trainers.rm_model import hidden_size
from rl.trainers.value_head import value_head


@dataclass(frozen=True)
class PPORollout:
    """A scored rollout ready for its updates; every tensor (B, T), left padded as
    :func:`rl.agent.loop.trajectory_batch`, 0 off policy tokens."""

    trajs: list[Trajectory]
    old_logps: torch.Tensor
    """Log-probs recorded while sampling."""
    old_values: torch.Tensor
    """The critic's values at the rollout."""
    advantages: torch.Tensor
    """GAE advantages (whitened when asked)."""
    returns: torch.Tensor
    """Value targets: un-whitened advantages + old values."""
    mask: torch.Tensor
    """1 on policy tokens."""
    metrics: dict[str, float]
    """Rollout statistics (rewards, values, returns, explained variance)."""


def values_of(
    backend: AgentBackend, head: torch.nn.Module, batch: dict[str, Any], *, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logps, mask, values)``, each (B, T), of a trajectory batch in one forward; values 0 off policy
    tokens."""
    logps, mask, states = backend.adapter.token_logps_states(batch, temperature=temperature)  # (B, T, H)
    values = head(states.to(head.weight.dtype)).squeeze(-1)  # (B, T)
    return logps, mask, values * mask.to(values.dtype)


def prepare_rollout(
    backend: AgentBackend,
    head: torch.nn.Module,
    trajs: Sequence[Trajectory],
    rewards: torch.Tensor,
    cfg: AgentPPOConfig,
    *,
    temperature: float = 1.0,
) -> PPORollout:
    """Old values, per-token rewards, GAE advantages and returns of sampled ``trajs``; ``rewards`` (B,)."""
    if len(trajs) != rewards.shape[0]:
        raise ValueError(
            f"need one reward per trajectory: {len(trajs)} trajectories, {rewards.shape[0]} rewards"
        )
    old, mask, values = rollout_values(
        backend, head, trajs, temperature=temperature, micro=cfg.micro_batch_size
    )
    r = token_rewards(rewards.float().to(values.device), mask)  # (B, T): the reward on each last policy token
    adv, returns = gae(r, values, mask, gamma=cfg.gamma, lam=cfg.lam)  # (B, T) each
    if rank_world()[1] > 1:  # the statistics of every rank's tokens
        return _over_ranks(trajs, rewards, old, values, adv, returns, mask, cfg)
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, mask)
    m = mask.to(adv.dtype)
    metrics = {
        "reward_mean": float(rewards.float().mean()),
        "value_mean": float(masked_mean(values, mask)),
        "return_mean": float(masked_mean(returns, mask)),
        "explained_variance": explained_variance(values, returns, mask),
    }
    return PPORollout(
        trajs=list(trajs), old_logps=old.to(values.device), old_values=values, advantages=adv * m,
        returns=returns * m, mask=mask, metrics=metrics,
    )  # fmt: skip


def _global_moments(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """:func:`rl.trainers.grpo_shard.global_moments` over this launch's ranks."""
    return global_moments(x, mask, world=rank_world()[1])


def _over_ranks(
    trajs: Sequence[Trajectory],
    rewards: torch.Tensor,
    old: torch.Tensor,
    values: torch.Tensor,
    adv: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cfg: AgentPPOConfig,
) -> PPORollout:
    """:func:`prepare_rollout`'s whitening and metrics under data parallel: over the global batch."""
    n, mean, var = _global_moments(adv, mask)
    if cfg.whiten_advantages:
        adv = (adv - mean) * (var + 1e-8) ** -0.5 if n else torch.zeros_like(adv)
    _, ret_mean, ret_var = _global_moments(returns, mask)
    _, _, err_var = _global_moments(returns.double() - values.double(), mask)
    metrics = {
        "reward_mean": total(float(rewards.double().sum())) / total(float(len(trajs))),
        "value_mean": _global_moments(values, mask)[1],
        "return_mean": ret_mean,
        "explained_variance": 1.0 - err_var / ret_var if ret_var else float("nan"),
    }
    m = mask.to(adv.dtype)
    return PPORollout(
        trajs=list(trajs), old_logps=old.to(values.device), old_values=values, advantages=adv * m,
        returns=returns * m, mask=mask, metrics=metrics,
    )  # fmt: skip


def rollout_values(
    backend: AgentBackend,
    head: torch.nn.Module,
    trajs: Sequence[Trajectory],
    *,
    temperature: float,
    micro: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(old_logps, mask, values)``, each (B, T) left padded to the batch's longest trajectory: the
    sampling-time log-probs, the policy-token mask and the critic's float values, ``micro`` trajectories a
    forward (0: one), without gradients."""
    parts = []
    for part in micro_batches(len(trajs), micro):
        batch, old = trajectory_batch(backend, trajs[part])  # (b, T') inputs, (b, T') sampling-time log-probs
        with torch.no_grad():
            _, mask, values = values_of(backend, head, batch, temperature=temperature)
        parts.append((old, mask, values.float()))
    if len(parts) == 1:
        return parts[0]
    T = max(old.shape[1] for old, _, _ in parts)

    def stack(i: int) -> torch.Tensor:  # every part's rows, right-aligned: (B, T)
        out = parts[0][i].new_zeros(len(trajs), T)
        row = 0
        for part in parts:
            t = part[i]
            out[row : row + t.shape[0], T - t.shape[1] :] = t
            row += t.shape[0]
        return out

    return stack(0), stack(1), stack(2)


def update_loss(
    backend: AgentBackend,
    head: torch.nn.Module,
    roll: PPORollout,
    rows: torch.Tensor,
    cfg: AgentPPOConfig,
    *,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one update on trajectories ``rows`` of ``roll``: clipped policy loss + ``vf_coef`` x
    clipped value loss, and detached metrics."""
    pg, vl, metrics = update_terms(backend, head, roll, rows, cfg, temperature=temperature)
    return pg + cfg.vf_coef * vl, metrics


def update_terms(
    backend: AgentBackend,
    head: torch.nn.Module,
    roll: PPORollout,
    rows: torch.Tensor,
    cfg: AgentPPOConfig,
    *,
    temperature: float = 1.0,
    horizon: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``(policy loss, value loss, metrics)`` of trajectories ``rows`` of ``roll``; ``horizon``: the padded
    length ``seq-mean-token-sum-norm`` divides by (default: these rows' own)."""
    sub = [roll.trajs[int(i)] for i in rows]
    batch, _ = trajectory_batch(backend, sub)  # (b, T'): left padded, so the last T' columns of the rollout
    width = batch["input_ids"].shape[1]

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t[rows.to(t.device)][:, -width:]  # (b, T')

    logps, mask, values = values_of(backend, head, batch, temperature=temperature)
    pg, metrics = policy_loss(
        logps, pick(roll.old_logps), pick(roll.advantages), mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
        agg=cfg.agg, horizon=horizon,
    )  # fmt: skip
    vl, vclip = value_loss(
        values.float(), pick(roll.old_values), pick(roll.returns), mask, clip_range=cfg.vf_clip
    )
    metrics.update(policy_loss=pg.detach(), value_loss=vl.detach(), value_clip_frac=vclip)
    return pg, vl, metrics


def update_backward(
    backend: AgentBackend,
    head: torch.nn.Module,
    roll: PPORollout,
    rows: torch.Tensor,
    cfg: AgentPPOConfig,
    *,
    temperature: float = 1.0,
) -> tuple[float, dict[str, float]]:
    """Backward of :func:`update_loss` on ``rows``, ``cfg.micro_batch_size`` trajectories a forward; the
    loss value and its metrics (the losses exact, the other metrics token-weighted means of the
    micro-batches'). Under data parallel ``rows`` are this rank's rows of the minibatch, none on a rank
    that holds none of it (it takes no backward; its gradients count as zero in the average)."""
    world = rank_world()[1]
    parts = micro_batches(len(rows), cfg.micro_batch_size)
    if len(parts) == 1 and world == 1:
        loss, metrics = update_loss(backend, head, roll, rows, cfg, temperature=temperature)
        loss.backward()
        return float(loss.detach()), {k: float(v) for k, v in metrics.items()}
    sub = [roll.trajs[int(i)] for i in rows]
    tokens = torch.tensor([float(sum(t.response_mask)) for t in sub])  # (b,) policy tokens per trajectory
    seqs = (tokens > 0).float()  # (b,) whether a trajectory counts in a sequence mean
    by_tokens = cfg.agg == "token-mean"
    pg_whole = total(float((tokens if by_tokens else seqs).sum())) or 1.0  # every rank's minibatch share
    vl_whole = total(float(tokens.sum())) or 1.0
    horizon = int(most(max((len(t.ids) for t in sub), default=0)))  # the whole minibatch's padded length
    pg_value = vl_value = 0.0
    sums: dict[str, float] = {}
    for part in parts:
        pg, vl, metrics = update_terms(
            backend, head, roll, rows[part], cfg, temperature=temperature, horizon=horizon
        )
        pg_share = float((tokens if by_tokens else seqs)[part].sum()) / pg_whole
        vl_share = float(tokens[part].sum()) / vl_whole  # the value loss is a token mean
        # times the ranks: the gradients are averaged over them (clip_grads)
        ((pg * pg_share + cfg.vf_coef * vl * vl_share) * world).backward()
        pg_value += float(pg.detach()) * pg_share
        vl_value += float(vl.detach()) * vl_share
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v) * float(tokens[part].sum())
    merged: dict[str, float] = {}  # every rank's sums (a rank without rows has none)
    for rank_sums in gathered([sums]):
        for k, v in rank_sums.items():
            merged[k] = merged.get(k, 0.0) + v
    out = {k: v / vl_whole for k, v in sorted(merged.items())}
    out.update(policy_loss=total(pg_value), value_loss=total(vl_value))
    return out["policy_loss"] + cfg.vf_coef * out["value_loss"], out


def ppo_optimizer(backend: AgentBackend, head: torch.nn.Module, cfg: AgentPPOConfig) -> torch.optim.Optimizer:
    """AdamW over the policy (``lr``) and the value head (``lr * critic_lr_scale``)."""
    policy = [p for p in backend.adapter.model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": policy, "lr": cfg.lr},
            {"params": list(head.parameters()), "lr": cfg.lr * cfg.critic_lr_scale},
        ],
        weight_decay=0.0,
    )


def ppo_step(
    backend: AgentBackend,
    head: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trajs: Sequence[Trajectory],
    reward: Callable[[Trajectory], float],
    cfg: AgentPPOConfig,
    *,
    seed: int,
    temperature: float = 1.0,
) -> dict[str, float]:
    """Every update of one rollout (``epochs`` x ``minibatches``); returns the step's metrics (update
    metrics averaged over its updates). Under data parallel ``trajs`` is this rank's contiguous share of
    the step's rows: the plan is one process's over every rank's rows, and each rank takes the rows of
    each minibatch that it holds (:func:`rl.trainers.ppo_shard.local_plan`), so a step is one process's."""
    rewards = torch.tensor([reward(t) for t in trajs], dtype=torch.float32)  # (B,)
    roll = prepare_rollout(backend, head, trajs, rewards, cfg, temperature=temperature)
    rank, world = rank_world()
    plan = minibatch_plan(len(trajs) * world, epochs=cfg.epochs, minibatches=cfg.minibatches, seed=seed)
    plan = local_plan(plan, lo=rank * len(trajs), hi=(rank + 1) * len(trajs))
    sums: dict[str, float] = {}
    params = [*backend.adapter.model.parameters(), *head.parameters()]
    for rows in plan:
        optimizer.zero_grad(set_to_none=True)
        loss, metrics = update_backward(backend, head, roll, rows, cfg, temperature=temperature)
        trained = [p for p in params if p.requires_grad]
        average_gradients(trained)  # data parallel (a no-op alone)
        limit = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(trained, limit)
        optimizer.step()
        for k, v in {**metrics, "loss": loss, "grad_norm": norm}.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    return {**roll.metrics, **{k: v / len(plan) for k, v in sums.items()}}


def run_ppo(
    cfg: AgentRunConfig, stage_dir: Path, init: Path, *, stop_after: int | None = None
) -> dict[str, Any] | None:
    """Multi-turn PPO from ``init``; resumes from ``stage_dir/checkpoint.pt``. ``stop_after``: stop once
    that step's checkpoint is written (a simulated interruption) and return None."""
    p = cfg.ppo
    backend = build_backend(cfg, init)
    torch.manual_seed(step_seed(cfg, "ppo-head", 0))
    head = value_head(hidden_size(backend.adapter.model))
    optimizer = ppo_optimizer(backend, head, p)
    ckpt = stage_dir / "checkpoint.pt"
    modules = {"model": backend.adapter.model, "head": head}
    start = load_checkpoint(ckpt, optimizer, modules)
    log = (
        MetricsLogger(stage_dir / "metrics.jsonl", resume_step=start if start else None)
        if is_writer()
        else None
    )
    tasks = train_tasks(cfg)
    loop = loop_config(cfg, tools=True, sample=True)
    reward = reward_fn(cfg)
    prepare_steps(cfg, tasks, range(start + 1, p.steps + 1), p.tasks_per_step)
    backend.adapter.model.train()
    for step in range(start + 1, p.steps + 1):
        trajs = step_rollout(
            cfg, backend, tasks, loop, stage="ppo", step=step, tasks_per_step=p.tasks_per_step,
            per_task=p.samples_per_task,
        )  # fmt: skip
        metrics = ppo_step(
            backend, head, optimizer, trajs, reward, p, seed=step_seed(cfg, "ppo-plan", step),
            temperature=cfg.grpo.temperature,
        )  # fmt: skip
        counts = rollout_summary(trajs)
        if log is not None:
            log.log({"step": step, **metrics, **counts})
        if step % p.checkpoint_every == 0 or step == p.steps:
            if is_writer():
                save_checkpoint(ckpt, step, optimizer, modules)
            barrier()
            if stop_after is not None and step >= stop_after:
                return None
    check_in_sync(backend.adapter.model, "ppo")
    check_in_sync(head, "ppo value head")
    if not is_writer():
        return {"stage": "ppo"}
    save_weights(backend, stage_dir / "model.pt")
    torch.save({k: v.float() for k, v in head.state_dict().items()}, stage_dir / "value_head.pt")
    records = read_metrics(stage_dir / "metrics.jsonl")
    return {"stage": "ppo", "steps": p.steps, "last": records[-1] if records else None}
