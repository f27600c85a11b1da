"""Data parallel GRPO: which prompts a rank samples, the global statistics it needs, its loss weight.

Under ``torchrun`` / ``accelerate launch`` every rank holds the whole model (:mod:`mm.train.loop`). A step:

1. the step's global prompt batch (``prompts_per_step``, a pure function of the seed and the step) is cut
   into contiguous shards, whole groups per rank (:func:`shard_positions`); each prompt's ``G`` completions
   are drawn from a generator seeded by ``(seed, step, sampling batch, position)``
   (:mod:`rl.rollout.seeded`), so 1 process and N processes sample the same completions;
2. the ``(groups, G)`` rewards are all-gathered (:func:`gather_rewards`, a few floats): every rank sees the
   global batch's rewards, so ``scale: batch`` advantages, DAPO dynamic sampling (which groups are kept:
   the first ``prompts_per_step`` informative ones in global order, as one process keeps them) and the
   reward metrics are the global batch's; a rank keeps the rows of its own kept groups, possibly none;
3. the loss aggregations of :func:`rl.losses.aggregate_loss` divide by the batch's token or sequence count;
   a rank divides by the *global* count and the skeleton averages gradients over ranks, so the rank's loss
   is multiplied by :func:`loss_weight` = ``local count * world / global count`` (DAPO's token-level
   normalisation over the whole batch, not per rank); the token-weighted metrics get the same weight, so
   the skeleton's mean over ranks is the global batch's value.

Single process all of this is the identity (weight exactly 1, no communication).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from mm.train import common
from rl.advantages import group_reward_std
from rl.sampling import fill_groups, informative_groups

AGG_BY_TOKENS = ("token-mean",)
"""Loss aggregations normalised by the number of response tokens; the others by non-empty sequences."""


def shard_positions(batch: int, *, rank: int, world: int) -> list[int]:
    """Positions (in the global prompt batch of ``batch`` groups) this rank samples: a contiguous shard."""
    return common.shard(list(range(batch)), rank=rank, world_size=world)


def check_world(prompts_per_step: int) -> None:
    """Refuse, before anything is written, a launch whose processes cannot share the step's prompts."""
    import os

    from mm.errors import UserError

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if prompts_per_step % world:
        raise UserError(
            f"data.prompts_per_step={prompts_per_step} must be divisible by {world} processes (each samples "
            "whole groups); change data.prompts_per_step or the number of processes"
        )


def gather_rewards(local: torch.Tensor, *, world: int) -> torch.Tensor:
    """This rank's ``(b, G)`` rewards -> the global ``(sum b, G)`` rewards, rank after rank (CPU, gloo).

    Ranks may hold different numbers of groups; single-process ``local`` itself.
    """
    if world == 1:
        return local
    x = local.detach().to("cpu", torch.float64)
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([x.shape[0]]))
    most = max(int(s) for s in sizes)
    padded = torch.zeros(most, *x.shape[1:], dtype=x.dtype)
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(s)] for p, s in zip(parts, sizes)]).to(local.dtype)


def global_stats(
    means: dict[str, tuple[float, float]],
    *,
    world: int,
    mins: dict[str, float] | None = None,
    maxs: dict[str, float] | None = None,
) -> dict[str, float]:
    """Global metrics from every rank's pieces: ``means`` ``{key: (sum, count)}`` -> ``sum / count`` over
    ranks (keys with a zero count left out), ``mins`` / ``maxs`` -> min / max over ranks. Ranks may send
    different keys (a rank without question prompts has no yes/no reward). One ``all_gather_object``."""
    mins, maxs = mins or {}, maxs or {}
    parts: list[Any] = [(means, mins, maxs)]
    if world > 1:
        parts = [None] * world
        dist.all_gather_object(parts, (means, mins, maxs))
    total: dict[str, list[float]] = {}
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for m, a, b in parts:
        for k, (s, n) in m.items():
            acc = total.setdefault(k, [0.0, 0.0])
            acc[0], acc[1] = acc[0] + s, acc[1] + n
        for k, v in a.items():
            lo[k] = min(lo.get(k, v), v)
        for k, v in b.items():
            hi[k] = max(hi.get(k, v), v)
    out = {k: s / n for k, (s, n) in total.items() if n > 0}
    return {**out, **lo, **hi}


def step_metrics(
    *,
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    sampled: list[torch.Tensor],
    group_size: int,
    stats: dict[str, tuple[float, float]],
    weights: torch.Tensor | None,
    mask: torch.Tensor | None,
    tis_cap: float,
    world: int,
) -> dict[str, float]:
    """A step's logged rollout metrics, the global batch's: reward statistics of the kept ``rewards``
    ``(B*G,)`` and their ``advantages``, the share of all-equal groups among every sampled batch (``sampled``:
    global ``(groups, G)`` per sampling call), ``stats`` (this rank's ``{key: (sum, count)}``) and the
    importance weights ``(b*G, W)`` over the response ``mask`` (None: no correction, or a stand-in rank)."""
    stats, mins, maxs = dict(stats), {}, {}
    if weights is not None and mask is not None:
        w = weights[mask.bool()]  # (tokens,)
        stats["is_weight_mean"] = (float(w.sum()), w.numel())
        stats["is_truncated_frac"] = (float((w >= tis_cap).sum()), w.numel())
        if w.numel():
            mins["is_weight_min"], maxs["is_weight_max"] = float(w.min()), float(w.max())
    return {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "zero_std_frac": float((~informative_groups(torch.cat(sampled))).float().mean()),
        "group_reward_std": float(group_reward_std(rewards, group_size=group_size).mean()),
        "adv_std": float(advantages.std()),
        "sample_batches": len(sampled),
        **global_stats(stats, world=world, mins=mins, maxs=maxs),
    }


def counts(mask: torch.Tensor, *, weighted: bool = True) -> tuple[float, float]:
    """``(response tokens, non-empty sequences)`` of a ``(B, W)`` response mask; ``(0, 0)`` when this
    rank's rows only stand in for an empty shard (``weighted=False``)."""
    if not weighted:
        return 0.0, 0.0
    return float(mask.sum()), float((mask.sum(-1) > 0).sum())


def global_counts(local: tuple[float, float], *, world: int) -> tuple[float, float]:
    """The global batch's ``(tokens, sequences)``: one all-reduce of this rank's :func:`counts`."""
    if world == 1:
        return local
    t = common.all_reduce_sum(torch.tensor(local, dtype=torch.float64))
    return float(t[0]), float(t[1])


def global_moments(x: torch.Tensor, mask: torch.Tensor, *, world: int) -> tuple[float, float, float]:
    """``(count, mean, unbiased variance)`` of ``x`` (B, T) over every rank's masked positions, in float64 and
    in two passes as :func:`rl.advantages.masked_var` (variance 0 below 2 positions)."""
    m = mask.to(torch.float64)
    xd = x.detach().double()
    n, s = global_counts((float(m.sum()), float((xd * m).sum())), world=world)
    mean = s / max(n, 1.0)
    sq = float(((xd - mean) ** 2 * m).sum())
    sq = sq if world == 1 else float(common.all_reduce_sum(torch.tensor([sq], dtype=torch.float64))[0])
    return n, mean, sq / (n - 1) if n > 1 else 0.0


def loss_weight(local: float, total: float, *, world: int) -> float:
    """``local * world / total``: turns a loss normalised by this rank's count into this rank's share of
    the global batch's loss, given that the skeleton averages over ``world`` ranks (1.0 single-process)."""
    return local * world / total if total > 0 else 0.0


def local_rows(kept: Sequence[Any], group_size: int) -> torch.Tensor:
    """Rows (of the global ``(len(kept) * G,)`` layout) of the kept groups this rank holds (not None)."""
    return torch.tensor(
        [g * group_size + i for g, x in enumerate(kept) if x is not None for i in range(group_size)],
        dtype=torch.long,
    )


class Collected(NamedTuple):
    """One step's sampled groups (:func:`collect_groups`)."""

    kept: list[Any]
    """The global batch's kept groups in order: this rank's records, None at the other ranks' positions."""
    rewards: torch.Tensor
    """``(B, G)`` rewards of the kept groups (global)."""
    groups: list[Any]
    """This rank's kept groups, or one stand-in group (loss weight 0) when it holds none."""
    weighted: bool
    """False when ``groups`` is the stand-in."""
    seen: list[torch.Tensor]
    """The rewards of every sampling batch drawn (for the metrics)."""
    stats: dict[str, tuple[float, float]]
    """Reward components summed over the batches drawn, as ``(sum, count)``."""


def collect_groups(
    sample: Callable[[int], tuple[list[Any], torch.Tensor, dict[str, tuple[float, float]]]],
    *,
    dynamic: bool,
    target_groups: int,
    max_batches: int,
) -> Collected:
    """Draw sampling batch ``k = 0, 1, ...`` by ``sample(k) -> (groups, rewards, components)`` once, or
    with DAPO's dynamic sampling (:func:`rl.sampling.fill_groups`) until ``target_groups`` informative
    groups are kept; the GRPO trainers' common first half of a step."""
    seen: list[torch.Tensor] = []
    stats: dict[str, tuple[float, float]] = {}
    stand_in: list[Any] = []
    calls = iter(range(max_batches))

    def sample_fn() -> tuple[list[Any], torch.Tensor]:
        groups, rewards, comps = sample(next(calls))
        seen.append(rewards)
        for key, (a, n) in comps.items():
            s0, n0 = stats.get(key, (0.0, 0.0))
            stats[key] = (s0 + a, n0 + n)
        stand_in.append(next(x for x in groups if x is not None))
        return groups, rewards

    if dynamic:
        filled = fill_groups(sample_fn, target_groups=target_groups, max_batches=max_batches)
        kept, rewards = filled.groups, filled.rewards
    else:
        kept, rewards = sample_fn()
    groups = [x for x in kept if x is not None]
    weighted = bool(groups)  # else the rank holds no kept group: a stand-in group with weight 0
    return Collected(list(kept), rewards, groups or stand_in[:1], weighted, seen, stats)
