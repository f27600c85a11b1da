"""Training a tool-using policy: SFT on demonstrations, then multi-turn GRPO over whole trajectories.

Both losses are taken only on policy tokens (``response_mask``); prompts and observations (tool text,
zoom images) are context, never targets, so their logits get exactly zero gradient.

- :func:`sft_loss`: token-mean negative log-likelihood of the demonstrations' policy turns.
- :func:`grpo_loss`: GRPO (Shao et al. 2024, eq. 3) with one outcome reward per trajectory and a group
  of trajectories per task, through ``rl.losses.policy_loss``. Deviations from single-turn GRPO: the
  "completion" is every policy turn of the trajectory (several separated spans, one advantage for
  all), and the old log-probs are the ones recorded while sampling (one forward over the concatenated
  ids reproduces them, so the first step is exactly on-policy).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rl.advantages import ADVANTAGE_SCALES, group_advantages
from rl.agent.backend import AgentBackend
from rl.agent.loop import LoopConfig, rollout, summary, trajectory_batch
from rl.agent.task import AgentTask
from rl.agent.tools import ToolRegistry
from rl.agent.trajectory import Trajectory
from rl.losses import AGG_MODES, aggregate_loss, policy_loss


@dataclass(frozen=True, kw_only=True)
class AgentGRPOConfig:
    """Multi-turn GRPO settings."""

    group_size: int = 4
    """Trajectories per task; advantages are centred (and scaled) within each group."""
    scale: str = "group"
    """Advantage scaling (``rl.advantages.group_advantages``): group, batch, or none (Dr. GRPO)."""
    eps_low: float = 0.2
    """Lower clip of the ratio (PPO-clip)."""
    eps_high: float | None = None
    """Upper clip of the ratio (DAPO clip-higher); None = eps_low."""
    agg: str = "token-mean"
    """How token losses become a scalar (``rl.losses.aggregate_loss``)."""

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group advantages, got {self.group_size}")
        if self.scale not in ADVANTAGE_SCALES:
            raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {self.scale!r}")
        if self.agg not in AGG_MODES:
            raise ValueError(f"agg must be one of {AGG_MODES}, got {self.agg!r}")


def normalise_answer(text: str) -> str:
    """Lower case, words only: "Red." and "red" are the same answer."""
    return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def answer_reward(traj: Trajectory, *, invalid_call_penalty: float = 0.1) -> float:
    """1 for an answer equal to the task's (normalised), 0 else, minus a penalty per invalid call."""
    correct = traj.answer is not None and normalise_answer(traj.answer) == normalise_answer(traj.task.answer)
    return float(correct) - invalid_call_penalty * traj.n_invalid_calls


def sft_loss(backend: AgentBackend, trajs: Sequence[Trajectory]) -> torch.Tensor:
    """Token-mean NLL of the policy turns of (demonstration) trajectories; observations are masked out."""
    batch, _ = trajectory_batch(backend, trajs)
    logps, mask = backend.adapter.token_logps(batch)  # (B, T), (B, T)
    return aggregate_loss(-logps, mask, mode="token-mean")


def turn_token_advantages(trajs: Sequence[Trajectory], per_turn: Sequence[Sequence[float]]) -> torch.Tensor:
    """Per-turn advantages (e.g. from turn-level simulator rewards) spread over each turn's policy
    tokens: (B, T), left padded like :func:`rl.agent.loop.trajectory_batch`, 0 off policy tokens."""
    if len(per_turn) != len(trajs):
        raise ValueError(f"need one list of turn advantages per trajectory: {len(trajs)} vs {len(per_turn)}")
    T = max(len(t.ids) for t in trajs)
    out = torch.zeros(len(trajs), T)  # (B, T)
    for b, (traj, values) in enumerate(zip(trajs, per_turn)):
        spans = [(s, e) for kind, s, e in traj.spans if kind == "policy"]
        if len(values) != len(spans):
            raise ValueError(f"trajectory {b} has {len(spans)} turns but {len(values)} turn advantages")
        pad = T - len(traj.ids)
        for (start, end), value in zip(spans, values):
            out[b, pad + start : pad + end] = float(value)
    return out


def grpo_loss(
    backend: AgentBackend,
    trajs: Sequence[Trajectory],
    rewards: torch.Tensor,
    cfg: AgentGRPOConfig,
    *,
    temperature: float = 1.0,
    advantages: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy loss of whole trajectories; ``trajs`` in groups of ``cfg.group_size`` per task,
    ``rewards`` (B,). ``temperature``: the sampling temperature (old log-probs were taken under it).
    ``advantages``: None = GRPO group advantages of ``rewards``; else (B,) or (B, T) given (e.g.
    :func:`turn_token_advantages` for turn-level credit)."""
    if len(trajs) != rewards.shape[0] or len(trajs) % cfg.group_size:
        raise ValueError(
            f"need B rewards for B trajectories, B a multiple of group_size={cfg.group_size}; "
            f"got {len(trajs)} trajectories, {rewards.shape[0]} rewards"
        )
    if advantages is None:
        advantages = group_advantages(rewards.float(), group_size=cfg.group_size, scale=cfg.scale)  # (B,)
    batch, old = trajectory_batch(backend, trajs)  # (B, T) inputs, (B, T) old log-probs
    logps, mask = backend.adapter.token_logps(batch, temperature=temperature)  # (B, T)
    advantages = advantages.to(logps.device)
    loss, metrics = policy_loss(
        logps, old, advantages, mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high, agg=cfg.agg
    )
    metrics["reward_mean"] = rewards.float().mean()
    metrics["advantage_abs_mean"] = advantages.abs().mean()
    return loss, metrics


def grpo_step(
    backend: AgentBackend,
    tasks: Sequence[AgentTask],
    reward_fn: Callable[[Trajectory], float],
    optimizer: torch.optim.Optimizer,
    cfg: AgentGRPOConfig,
    loop: LoopConfig,
    *,
    registry: ToolRegistry | None = None,
) -> tuple[list[Trajectory], dict[str, Any]]:
    """Roll out ``group_size`` trajectories per task, reward them, take one optimiser step."""
    group = [task for task in tasks for _ in range(cfg.group_size)]
    trajs = rollout(backend, group, loop, registry=registry)
    rewards = torch.tensor([reward_fn(t) for t in trajs], dtype=torch.float32)  # (B,)
    optimizer.zero_grad(set_to_none=True)
    temperature = loop.sampling.temperature if loop.sampling.do_sample else 1.0
    loss, metrics = grpo_loss(backend, trajs, rewards, cfg, temperature=temperature)
    loss.backward()
    optimizer.step()
    out = {k: float(v) for k, v in metrics.items()} | summary(trajs) | {"loss": float(loss.detach())}
    return trajs, out
