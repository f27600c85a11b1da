"""Advantage estimators (pure functions): GRPO group advantages, RLOO, GAE, masked whitening.

Rewards of a GRPO batch are laid out flat, group after group: ``rewards[g * n + i]`` is the reward
of completion ``i`` of prompt ``g`` (``n = group_size``), which is TRL's layout.
"""

from __future__ import annotations

import torch

__all__ = [
    "ADVANTAGE_SCALES",
    "gae",
    "group_advantages",
    "group_reward_std",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "rloo_advantages",
]

ADVANTAGE_SCALES = ("group", "batch", "none")


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards length {rewards.numel()} must be a multiple of group_size {group_size} (>= 1); "
            "pass the rewards of whole groups, group after group"
        )
    return rewards.view(-1, group_size)  # (G, n)


def group_reward_std(rewards: torch.Tensor, *, group_size: int) -> torch.Tensor:
    """Unbiased std of the rewards of each group ``(B,) -> (G,)``; 0 for groups of one (no NaN).

    A group whose std is 0 (all rewards equal) gives zero advantages and no gradient: log the
    fraction of such groups, and see ``rl.sampling`` for DAPO's dynamic sampling that drops them.
    """
    grouped = _grouped(rewards, group_size)  # (G, n)
    if group_size == 1:
        return torch.zeros(grouped.shape[0], dtype=rewards.dtype, device=rewards.device)
    return grouped.std(dim=1)


def group_advantages(
    rewards: torch.Tensor, *, group_size: int, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """GRPO outcome advantages ``A_i = (r_i - mean_group(r)) / (std + eps)`` ``(B,) -> (B,)``.

    GRPO: Shao et al. 2024, "DeepSeekMath", eq. 3 (outcome supervision). ``scale``:

    - ``"group"``: divide by the unbiased std of the group (the paper; TRL ``scale_rewards="group"``).
    - ``"batch"``: divide by the unbiased std of the whole batch, still centred per group
      (TRL ``scale_rewards="batch"``, after Hu et al. 2025 "REINFORCE++").
    - ``"none"``: no division: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"),
      which removes the std term's difficulty bias.

    Matches TRL 1.16 (``eps`` added to the std, default 1e-4, Bessel-corrected std), with one
    deliberate difference: a group whose rewards are all equal gets advantages of exactly 0 (TRL
    returns ``(r - mean) / (0 + eps)``, which is 0 only up to rounding of the mean). A group of size 1
    gets 0 as in TRL. verl differs: ``eps = 1e-6`` and a group of size 1 keeps its raw reward
    (mean 0, std 1) — pass ``eps=1e-6`` for verl's epsilon.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    grouped = _grouped(rewards, group_size)  # (G, n)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (G, n)
    constant = (grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)).expand_as(grouped)
    if scale == "group":
        std = group_reward_std(rewards, group_size=group_size).unsqueeze(1)  # (G, 1)
        centred = centred / (std + eps)
    elif scale == "batch":
        std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
        centred = centred / (std + eps)
    return torch.where(constant, torch.zeros_like(centred), centred).reshape(-1)


def rloo_advantages(rewards: torch.Tensor, *, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out: ``A_i = r_i - mean_{j != i} r_j`` ``(B,) -> (B,)``.

    Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
    Human Feedback in LLMs", eq. 4 (baseline over the other k-1 samples). Equals TRL's
    ``RLOOTrainer`` (without its optional batch normalisation) and verl's ``compute_rloo_outcome_advantage``
    (``n/(n-1) * (r_i - mean)``). A group of one has no baseline: its advantage is 0 (as TRL).
    """
    grouped = _grouped(rewards, group_size)  # (G, n)
    if group_size == 1:
        return torch.zeros_like(rewards)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # (G, n)
    return (grouped - baseline).reshape(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1; 0 (not NaN) where the mask is empty."""
    m = mask.to(values.dtype)
    if dim is None:
        return (values * m).sum() / m.sum().clamp(min=1.0)
    return (values * m).sum(dim) / m.sum(dim).clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the masked positions (Bessel-corrected when ``unbiased``); 0 if < 2."""
    count = mask.to(values.dtype).sum()
    var = masked_mean((values - masked_mean(values, mask)) ** 2, mask)
    if unbiased:
        var = torch.where(count > 1, var * count / (count - 1).clamp(min=1.0), torch.zeros_like(var))
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True) -> torch.Tensor:
    """Whiten ``values`` with the mean and unbiased variance of the masked positions only.

    ``(v - mean) / sqrt(var + 1e-8)`` (``+ mean`` back when ``shift_mean=False``), as verl's
    ``masked_whiten`` (PPO advantage normalisation, Schulman et al. 2017 / OpenAI baselines). Positions
    with mask 0 are transformed too (same affine map) but do not enter the statistics. Deviation from
    verl, which raises on fewer than 2 masked values: the variance is taken as 0 then, and an empty
    mask returns zeros (no signal, no NaN).
    """
    if values.shape != mask.shape:
        raise ValueError(f"values and mask must match; got {tuple(values.shape)} vs {tuple(mask.shape)}")
    if not bool(mask.any()):
        return torch.zeros_like(values)
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + 1e-8)
    return whitened if shift_mean else whitened + mean


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation with mask-0 positions skipped: ``(B, T) x3 -> (adv, returns)``.

    Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE", eq. 16:
    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``, with V = 0 after the
    last position. Positions where ``mask`` is 0 (tool/observation tokens inside a multi-turn response,
    padding) are *skipped* exactly as verl's ``compute_gae_advantage_return``: they do not update the
    running ``V_{t+1}`` or ``A_{t+1}``, so a response token right before a tool span bootstraps from
    the next *response* token's value, and rewards placed on mask-0 positions are ignored. A mask-0
    position receives the advantage carried from the next response token (mask it out downstream).

    Returns un-whitened advantages and ``returns = advantages + values`` (value targets); verl then
    whitens the advantages — call :func:`masked_whiten` for that.
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise ValueError(
            "rewards, values and mask must all be (B, T); got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)}"
        )
    m = mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])  # (B,)
    last_adv = torch.zeros_like(values[:, 0])  # (B,)
    reversed_adv = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * last_adv
        next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
        last_adv = adv_t * m[:, t] + (1 - m[:, t]) * last_adv
        reversed_adv.append(last_adv)
    if not reversed_adv:
        return torch.zeros_like(values), torch.zeros_like(values)
    advantages = torch.stack(reversed_adv[::-1], dim=1)  # (B, T)
    return advantages, advantages + values
