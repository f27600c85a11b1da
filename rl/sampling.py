"""DAPO dynamic sampling and the overlong-response soft penalty (Yu et al. 2025, "DAPO").

Dynamic sampling (DAPO sec. 3.2, eq. 11): a group whose rewards are all equal has zero advantage
for every member and contributes no gradient, only noise in the loss normaliser. DAPO drops such
groups and keeps sampling until the batch holds the target number of informative groups. verl
implements it in ``ray_trainer`` with ``filter_groups`` / ``max_num_gen_batches``; here it is a
pure helper around a sampling callable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mm.errors import UserError

__all__ = ["FilledGroups", "fill_groups", "informative_groups", "overlong_penalty"]


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Which groups have rewards that are not all equal: ``(G, n) -> bool (G,)``.

    A group of one completion counts as informative (it has no within-group spread to lose), as in
    verl's filter (``std > 0 or len == 1``).
    """
    if rewards.dim() != 2:
        raise ValueError(
            f"rewards must be (G, n): one row per prompt group; got shape {tuple(rewards.shape)}"
        )
    if rewards.shape[1] == 1:
        return torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)
    return rewards.amax(dim=1) != rewards.amin(dim=1)


@dataclass(frozen=True)
class FilledGroups:
    """Result of :func:`fill_groups`."""

    groups: list[Any]
    """the kept groups, in sampling order, exactly ``target_groups`` of them"""
    rewards: torch.Tensor
    """``(target_groups, n)`` rewards of the kept groups"""
    num_batches: int
    """how many times the sampling callable was called"""
    num_sampled: int
    """groups sampled in total (kept, dropped and surplus)"""
    num_dropped: int
    """groups dropped because all their rewards were equal"""


def fill_groups(
    sample_fn: Callable[[], tuple[Sequence[Any], torch.Tensor]],
    *,
    target_groups: int,
    max_batches: int = 8,
) -> FilledGroups:
    """Call ``sample_fn`` until ``target_groups`` informative groups are collected (DAPO Algorithm 1).

    Args:
        sample_fn: returns ``(groups, rewards)`` for a fresh batch of prompts: ``groups`` is any
            sequence of ``G`` per-prompt records (token ids, masks, ...) and ``rewards`` is ``(G, n)``.
        target_groups: number of groups the training batch needs (>= 1).
        max_batches: give up after this many calls (verl's ``max_num_gen_batches``).

    Groups beyond the target in the last batch are discarded (as verl). Raises ``UserError`` when the
    budget runs out, since then nearly every group is all-correct or all-wrong: the data is too easy or
    too hard for the model, or the reward is constant.
    """
    if target_groups < 1 or max_batches < 1:
        raise ValueError(f"target_groups and max_batches must be >= 1; got {target_groups}, {max_batches}")
    kept: list[Any] = []
    kept_rewards: list[torch.Tensor] = []
    sampled = dropped = 0
    for batch in range(1, max_batches + 1):
        groups, rewards = sample_fn()
        if rewards.dim() != 2 or rewards.shape[0] != len(groups):
            raise ValueError(
                f"sample_fn must return G groups and (G, n) rewards; got {len(groups)} groups and rewards "
                f"of shape {tuple(rewards.shape)}"
            )
        keep = informative_groups(rewards)  # (G,)
        sampled += len(groups)
        dropped += int((~keep).sum())
        for i in torch.nonzero(keep).flatten().tolist():
            if len(kept) < target_groups:
                kept.append(groups[i])
                kept_rewards.append(rewards[i])
        if len(kept) == target_groups:
            return FilledGroups(kept, torch.stack(kept_rewards), batch, sampled, dropped)
    raise UserError(
        f"dynamic sampling found {len(kept)} of {target_groups} groups with unequal rewards after "
        f"{max_batches} batches ({dropped} of {sampled} groups had all-equal rewards): the prompts are "
        "too easy or too hard for the model, or the reward is constant; raise max_batches, change the "
        "data or the reward, or turn dynamic sampling off"
    )


def overlong_penalty(
    lengths: torch.Tensor, *, max_length: int, cache_length: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the task reward: ``(B,) -> (B,)``.

    ``0`` for ``|y| <= L_max - L_cache``; ``factor * ((L_max - L_cache) - |y|) / L_cache`` inside the
    cache window; ``-factor`` beyond ``L_max``. ``factor`` is verl's ``overlong_penalty_factor``
    (1 in the paper); verl has no separate cap beyond ``L_max`` (responses are truncated there).
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"need 0 < cache_length <= max_length; got cache_length={cache_length}, max_length={max_length}"
        )
    expected = max_length - cache_length
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    over = (lengths.to(dtype) - expected).clamp(min=0.0, max=float(cache_length))  # (B,)
    return -factor * over / cache_length
