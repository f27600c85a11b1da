"""Training a tool-using policy: SFT on demonstrations, then multi-turn GRPO over whole trajectories.

Both losses are taken only on policy tokens (``response_mask``); prompts and observations (tool text,
zoom images) are context, never targets, so their logits get exactly zero gradient.

- :func:`sft_loss`: token-mean negative log-likelihood of the demonstrations' policy turns, the turns that
  call a tool optionally weighted up (:func:`call_token_weights`).
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
    turn_credit: float = 0.0
    """Weight of the turn-level advantages (:func:`turn_advantages`) added to the trajectory's on each
    dialogue turn's tokens; 0 = one advantage for the whole trajectory."""

    def __post_init__(self) -> None:
        if self.turn_credit < 0:
            raise ValueError(f"turn_credit must be >= 0, got {self.turn_credit}")
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


def call_token_weights(trajs: Sequence[Trajectory], call_weight: float) -> torch.Tensor:
    """(B, T), left padded like the batch: ``call_weight`` on every token of a policy turn that made a tool
    call (valid or not), 1 elsewhere (the loss mask decides which tokens count at all)."""
    T = max(len(t.ids) for t in trajs)
    out = torch.ones(len(trajs), T)  # (B, T)
    for b, traj in enumerate(trajs):
        spans = [(s, e) for kind, s, e in traj.spans if kind == "policy"]
        pad = T - len(traj.ids)
        for turn in {c.turn - 1 for c in traj.calls}:  # CallRecord.turn counts policy turns from 1
            start, end = spans[turn]
            out[b, pad + start : pad + end] = call_weight
    return out


def sft_loss(backend: AgentBackend, trajs: Sequence[Trajectory], *, call_weight: float = 1.0) -> torch.Tensor:
    """Token-mean NLL of the policy turns of (demonstration) trajectories; observations are masked out,
    and so are policy turns taken out of the loss (``Trajectory.train_mask``). With ``call_weight`` != 1
    the mean is weighted: the tokens of turns that call a tool count ``call_weight`` times, so the few
    tokens that choose the photo and the box are not outweighed by long answers."""
    batch = backend.model_inputs([t.segment for t in trajs], [t.train_mask for t in trajs])
    logps, mask = backend.adapter.token_logps(batch)  # (B, T), (B, T)
    if call_weight == 1.0:
        return aggregate_loss(-logps, mask, mode="token-mean")
    weights = call_token_weights(trajs, call_weight).to(logps.device) * mask  # (B, T)
    return -(logps * weights).sum() / weights.sum().clamp(min=1e-8)


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


def reply_scores(traj: Trajectory) -> list[float | None]:
    """Per policy turn, the simulated user's score of the reply that closes its stretch (the reply itself,
    or a tool call made before it); None for a turn no reply closes, and for every turn of a trajectory
    the user did not judge."""
    scores = {u.turn: u.score for u in traj.user_turns}
    out: list[float | None] = [None] * len(traj.turns)
    pending: list[int] = []
    for i in range(len(traj.turns)):
        pending.append(i)
        if i + 1 in scores:
            for k in pending:
                out[k] = scores[i + 1]
            pending = []
    return out


def judged_scores(trajs: Sequence[Trajectory]) -> list[float]:
    """The simulated user's score of every judged reply of ``trajs``, in order."""
    return [u.score for t in trajs for u in t.user_turns]


def turn_advantages(
    trajs: Sequence[Trajectory],
    *,
    group_size: int,
    scale: str = "group",
    batch_scores: Sequence[float] | None = None,
) -> list[list[float]]:
    """Turn-level advantages within each group of ``group_size`` trajectories (after MT-GRPO, Zeng et al.
    2025, with the group's replies pooled over turns): each turn's :func:`reply_scores` value minus the
    mean score of the group's judged replies, over their unbiased std ("group"; "batch": the std of every
    judged reply of the batch; "none": no division). 0 where no reply closes the turn, and everywhere in
    a group whose judged replies all scored the same. ``batch_scores``: the :func:`judged_scores` of the
    whole batch when ``trajs`` is a share of it (data parallel: every rank's, in rank order); default
    ``trajs``' own."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    if len(trajs) % group_size:
        raise ValueError(f"{len(trajs)} trajectories do not split into groups of {group_size}")

    def std(values: list[float]) -> float:
        return torch.tensor(values, dtype=torch.float64).std().item() if len(values) > 1 else 0.0

    batch_std = std(list(judged_scores(trajs) if batch_scores is None else batch_scores))
    out: list[list[float]] = []
    for g in range(0, len(trajs), group_size):
        group = trajs[g : g + group_size]
        per = [reply_scores(t) for t in group]
        values = [u.score for t in group for u in t.user_turns]
        if not values or max(values) == min(values):
            out += [[0.0] * len(row) for row in per]
            continue
        mean = sum(values) / len(values)
        div = {"group": std(values) + 1e-4, "batch": batch_std + 1e-4, "none": 1.0}[scale]
        out += [[0.0 if v is None else (v - mean) / div for v in row] for row in per]
    return out


def trajectory_advantages(
    trajs: Sequence[Trajectory],
    rewards: torch.Tensor,
    cfg: AgentGRPOConfig,
    *,
    sequence: torch.Tensor | None = None,
    batch_scores: Sequence[float] | None = None,
) -> torch.Tensor:
    """GRPO group advantages of ``rewards`` (B,) (or ``sequence``, (B,), computed elsewhere: from a larger
    batch's rewards), plus ``cfg.turn_credit`` times :func:`turn_advantages` on each turn's tokens, which
    makes them (B, T), left padded like :func:`rl.agent.loop.trajectory_batch`. ``batch_scores``: the
    larger batch's judged replies, for ``scale: batch`` turn credit."""
    if sequence is None:
        sequence = group_advantages(rewards.float(), group_size=cfg.group_size, scale=cfg.scale)  # (B,)
    if not cfg.turn_credit:
        return sequence
    turns = turn_advantages(trajs, group_size=cfg.group_size, scale=cfg.scale, batch_scores=batch_scores)
    return sequence[:, None] + cfg.turn_credit * turn_token_advantages(trajs, turns)  # (B, T)


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
    ``advantages``: None = GRPO group advantages of ``rewards`` (plus ``cfg.turn_credit`` times
    :func:`turn_advantages` on each turn's tokens); else (B,) or (B, T) given."""
    if len(trajs) != rewards.shape[0] or len(trajs) % cfg.group_size:
        raise ValueError(
            f"need B rewards for B trajectories, B a multiple of group_size={cfg.group_size}; "
            f"got {len(trajs)} trajectories, {rewards.shape[0]} rewards"
        )
    if advantages is None:
        advantages = trajectory_advantages(trajs, rewards, cfg)
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
