"""Data parallel ``rl ppo``: which rows of each minibatch a rank trains on, and the global statistics.

Under ``torchrun`` / ``accelerate launch`` each rank samples a contiguous shard of the step's prompts
(``rl grpo``'s seeded sampler, :mod:`rl.trainers.grpo_shard`), so it holds the global rollout's rows
``lo .. hi - 1`` (prompt-major). Then:

1. GAE runs on each rank's own rows (a row's advantages depend on that row alone);
2. the advantages are whitened with the mean and variance of every rank's response tokens
   (:func:`whiten`), and the rollout's token means (values, returns, explained variance, KL) are taken
   over every rank's tokens (:func:`rollout_means`);
3. the minibatch plan is the one process's plan over the global rows (:func:`rl.trainers.ppo_math.
   minibatch_plan`, same seed); a rank trains on the rows of each minibatch that it holds
   (:func:`local_plan`), possibly none (a stand-in row with weight 0 then);
4. each update's policy loss is normalised by the minibatch's global token (or sequence) count and its
   value loss by its global token count: a rank's losses are weighted by ``local * world / global``
   (:func:`update_shares`), so the skeleton's mean of the gradients over ranks is one process's update.

Single process all of this is the identity (the whole plan, weights exactly 1, no communication).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from mm.train import common
from rl.trainers.grpo_shard import AGG_BY_TOKENS, global_moments, loss_weight


class Shares(NamedTuple):
    """One update's loss weights on this rank (:func:`update_shares`)."""

    policy: float
    """The policy loss's: by the minibatch's tokens (``token-mean``) or non-empty sequences."""
    tokens: float
    """By the minibatch's response tokens: the value loss and the token-averaged metrics."""


WHOLE = Shares(1.0, 1.0)
"""The weights of one process, which holds the whole minibatch."""


def local_plan(plan: Sequence[torch.Tensor], *, lo: int, hi: int) -> list[torch.Tensor]:
    """Each update's rows (global indices) that fall in this rank's rows ``lo .. hi - 1``, as local
    indices, in the plan's order (empty where the rank holds none of the minibatch)."""
    out = []
    for rows in plan:
        keep = (rows >= lo) & (rows < hi)
        out.append(rows[keep] - lo)
    return out


def update_shares(plan: Sequence[torch.Tensor], mask: torch.Tensor, *, agg: str, world: int) -> list[Shares]:
    """This rank's :class:`Shares` of every update of ``plan`` (local rows of the ``(b, W)`` response
    ``mask``); one all-reduce for the whole plan. All ones single-process."""
    tokens_per_row = mask.to(torch.float64).sum(-1)  # (b,)
    local = torch.tensor(
        [[float(tokens_per_row[r].sum()), float((tokens_per_row[r] > 0).sum())] for r in plan],
        dtype=torch.float64,
    ).reshape(len(plan), 2)  # (U, 2): tokens, sequences
    total = local if world == 1 else common.all_reduce_sum(local)
    out = []
    for (t, s), (all_t, all_s) in zip(local.tolist(), total.tolist()):
        by_tokens, by_seqs = loss_weight(t, all_t, world=world), loss_weight(s, all_s, world=world)
        out.append(Shares(by_tokens if agg in AGG_BY_TOKENS else by_seqs, by_tokens))
    return out


def whiten(adv: torch.Tensor, mask: torch.Tensor, *, world: int) -> torch.Tensor:
    """``(adv - mean) / sqrt(var + 1e-8)`` with the mean and unbiased variance of every rank's masked
    positions (:func:`rl.advantages.masked_whiten` over the global batch); zeros when no rank has one."""
    n, mean, var = global_moments(adv, mask, world=world)
    if not n:
        return torch.zeros_like(adv)
    return ((adv.double() - mean) * (var + 1e-8) ** -0.5).to(adv.dtype)


def rollout_means(
    *,
    values: torch.Tensor,
    returns: torch.Tensor,
    adv: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    kl: torch.Tensor | None,
    rows: int,
    world: int,
) -> dict[str, float]:
    """The rollout metrics :class:`rl.trainers.ppo.PPOTrainer` logs, over every rank's ``(b, W)`` tokens
    (``rewards``: the per-token rewards; ``rows``: the global number of responses)."""
    n, value_mean, _ = global_moments(values, mask, world=world)
    _, return_mean, return_var = global_moments(returns, mask, world=world)
    _, _, err_var = global_moments(returns.double() - values.double(), mask, world=world)
    _, _, adv_var = global_moments(adv, mask, world=world)
    _, reward_sum_mean, _ = global_moments(rewards, mask, world=world)
    out = {
        "adv_std": adv_var**0.5,
        "sampled_tokens": n,
        "token_reward_sum": reward_sum_mean * n / rows,
        "value_mean": value_mean,
        "return_mean": return_mean,
        "explained_variance": 1.0 - err_var / return_var if return_var else float("nan"),
    }
    if kl is not None:
        out["kl"] = global_moments(kl, mask, world=world)[1]
    return out
