"""Gradient accumulation over micro-batches of trajectories: the whole batch's gradient, a few at a time.

    loss = sft_backward(backend, trajs, call_weight=1.0, micro=2)              # SFT: grads accumulated
    loss, metrics = grpo_backward(backend, trajs, rewards, cfg, temperature=1.0, micro=2)

A large policy cannot take a step's trajectories (images and all) in one forward. Each micro-batch's loss
is its share of the whole batch's loss, so the accumulated gradient is the whole batch's (tested against
one pass): the loss's normaliser (tokens, or sequences for the ``seq-mean-*`` aggregations, and the
padded horizon of ``seq-mean-token-sum-norm``) is counted over the whole batch before any forward, and
GRPO's advantages are computed from the whole batch's rewards. ``micro`` 0 is one pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl.advantages import group_advantages
from rl.agent.backend import AgentBackend
from rl.agent.loop import trajectory_batch
from rl.agent.parallel import gathered, most, rank_world, total
from rl.agent.train import (
    AgentGRPOConfig,
    call_token_weights,
    grpo_loss,
    judged_scores,
    sft_loss,
    trajectory_advantages,
)
from rl.agent.trajectory import Trajectory
from rl.losses import policy_loss
from rl.trainers.grpo_shard import gather_rewards


def micro_batches(n: int, micro: int) -> list[slice]:
    """Consecutive slices of ``n`` rows, ``micro`` at a time (0: one slice)."""
    size = micro if micro > 0 else max(n, 1)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def sft_weight(trajs: Sequence[Trajectory], call_weight: float) -> float:
    """The denominator of :func:`rl.agent.train.sft_loss`: its tokens, each counted ``call_weight`` times
    in a turn that calls a tool (no forward)."""
    weights = call_token_weights(trajs, call_weight)  # (B, T), left padded
    T = weights.shape[1]
    total = 0.0
    for b, traj in enumerate(trajs):
        mask = torch.tensor(traj.train_mask, dtype=weights.dtype)  # (len(ids),)
        total += float((weights[b, T - len(traj.ids) :] * mask).sum())
    return total


def sft_backward(
    backend: AgentBackend, trajs: Sequence[Trajectory], *, call_weight: float, micro: int
) -> float:
    """Backward of the whole batch's :func:`sft_loss`, ``micro`` trajectories a forward; its value. Under
    data parallel (:mod:`rl.agent.parallel`) ``trajs`` is this rank's share: its loss is its share of the
    global batch's, times the ranks (the gradients are then averaged over them), and the value returned is
    the global batch's loss."""
    world = rank_world()[1]
    parts = micro_batches(len(trajs), micro)
    if len(parts) == 1 and world == 1:
        loss = sft_loss(backend, trajs, call_weight=call_weight)
        loss.backward()
        return float(loss.detach())
    whole = total(sft_weight(trajs, call_weight))
    value = 0.0
    for part in parts:
        chunk = trajs[part]
        loss = sft_loss(backend, chunk, call_weight=call_weight) * (sft_weight(chunk, call_weight) / whole)
        (loss * world).backward()
        value += float(loss.detach())
    return total(value)


def _shares(trajs: Sequence[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per trajectory: its policy tokens, and whether it has any (B,), B = len(trajs)."""
    tokens = torch.tensor([float(sum(t.response_mask)) for t in trajs])
    return tokens, (tokens > 0).float()


def grpo_backward(
    backend: AgentBackend,
    trajs: Sequence[Trajectory],
    rewards: torch.Tensor,
    cfg: AgentGRPOConfig,
    *,
    temperature: float,
    micro: int,
) -> tuple[float, dict[str, float]]:
    """Backward of :func:`rl.agent.train.grpo_loss` on the whole batch, ``micro`` trajectories a forward
    (whole groups need not stay together: the advantages are the whole batch's); the loss value and its
    metrics (token-weighted means of the micro-batches')."""
    rank, world = rank_world()
    parts = micro_batches(len(trajs), micro)
    if len(parts) == 1 and world == 1:
        loss, metrics = grpo_loss(backend, trajs, rewards, cfg, temperature=temperature)
        loss.backward()
        return float(loss.detach()), {k: float(v) for k, v in metrics.items()}
    everyone = gather_rewards(rewards.float().view(-1, cfg.group_size), world=world).flatten()  # (world*B,)
    sequence = group_advantages(everyone, group_size=cfg.group_size, scale=cfg.scale)  # (world * B,)
    rows = slice(rank * len(trajs), (rank + 1) * len(trajs))  # this rank's rows
    batch_scores = None
    if cfg.turn_credit and cfg.scale == "batch":  # every rank's judged replies scale the turn credit
        batch_scores = gathered(judged_scores(trajs))
    advantages = trajectory_advantages(  # (B,) or (B, T)
        trajs, rewards, cfg, sequence=sequence[rows], batch_scores=batch_scores
    )
    rewards = everyone
    tokens, seqs = _shares(trajs)
    by_tokens = cfg.agg == "token-mean"
    whole = total(float((tokens if by_tokens else seqs).sum())) or 1.0
    horizon = int(most(max(len(t.ids) for t in trajs)))  # seq-mean-token-sum-norm: the global batch's T
    value, sums = 0.0, {}
    for part in parts:
        chunk = trajs[part]
        batch, old = trajectory_batch(backend, chunk)  # (b, T') inputs, (b, T') old log-probs
        logps, mask = backend.adapter.token_logps(batch, temperature=temperature)  # (b, T')
        adv = advantages[part]
        if adv.dim() == 2:  # left padded to the whole batch's T: the chunk's rows end in its last columns
            adv = adv[:, adv.shape[1] - logps.shape[1] :]
        loss, metrics = policy_loss(
            logps, old, adv.to(logps.device), mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high, agg=cfg.agg,
            horizon=horizon,
        )  # fmt: skip
        part_share = float((tokens if by_tokens else seqs)[part].sum()) / whole
        (loss * part_share * world).backward()
        value += float(loss.detach()) * part_share
        weight = float(tokens[part].sum())
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v) * weight
    all_tokens = max(total(float(tokens.sum())), 1.0)
    out = {k: total(v) / all_tokens for k, v in sorted(sums.items())}
    out["reward_mean"] = float(rewards.float().mean())
    out["advantage_abs_mean"] = total(float(advantages.abs().sum())) / total(advantages.numel())
    return total(value), out
