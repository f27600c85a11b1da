"""Truncated importance sampling (TIS) between the rollout engine and the trainer (pure functions).

A rollout engine (vLLM, or the in-process sampler with top-p / top-k) samples from a distribution
``mu`` that is not the trainer's ``pi_old`` (the trainer scores the sampled tokens with the plain
``softmax(logits / T)`` of its own forward). The policy gradient is an expectation under ``pi_old``,
so each token's loss is reweighted by ``pi_old(y_t) / mu(y_t)``, truncated at a cap ``C`` to bound
the variance (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training"; TRL ``vllm_importance_sampling_mode="token_truncate"`` with
``vllm_importance_sampling_cap`` / ``clip_max``; verl's rollout correction ``rollout_is="token"``)::

    w_t = min(exp(log pi_old(y_t) - log mu(y_t)), C)          (detached)
    loss_t <- w_t * loss_t                                     (before aggregation)

``level="sequence"`` uses one weight per sequence, ``min(exp(sum_t (log pi_old - log mu)), C)``
(TRL ``sequence_truncate``). As TRL, the log-ratio is taken as ``(pi_old - mu) * mask`` with NaN
(a log-prob the engine did not return) mapped to 0, so masked and unknown tokens weigh exactly 1.

Applying the weights: the clipped surrogate ``max(-A r, -A clip(r))`` (and the dual clip
``min(., -A c)``) is positively homogeneous in ``A``, so ``w_t * loss_t(A) = loss_t(w_t * A)`` for
``w_t >= 0``; :func:`weighted_advantages` turns ``(B,)`` advantages into ``(B, T)`` token advantages
``A * w_t`` that :func:`rl.losses.policy_loss` takes as they are (the tests check this against
TRL's ``per_token_loss * importance_sampling_ratio``). Clip fractions keep their meaning since
``A * w`` has the sign of ``A``.
"""

from __future__ import annotations

import torch

IS_LEVELS = ("token", "sequence")
"""Granularity of the truncated importance weights."""


def truncated_is_weights(
    trainer_logps: torch.Tensor,
    rollout_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float,
    level: str = "token",
) -> torch.Tensor:
    """Truncated importance weights ``min(exp(trainer - rollout), cap)``, detached.

    Args:
        trainer_logps: ``(B, T)`` log-probs of the sampled tokens under the trainer's distribution.
        rollout_logps: ``(B, T)`` log-probs of the same tokens under the distribution they were sampled
            from (NaN = unknown: weight 1).
        mask: ``(B, T)`` response mask (1 on scored tokens).
        cap: ``C > 0``, the truncation.
        level: ``token`` (one weight per token) or ``sequence`` (one per row, broadcast over its tokens).

    Returns:
        ``(B, T)`` weights in ``(0, cap]``; 1 where ``mask`` is 0.
    """
    if trainer_logps.shape != rollout_logps.shape or trainer_logps.shape != mask.shape:
        raise ValueError(
            "trainer_logps, rollout_logps and mask must have the same (B, T) shape; got "
            f"{tuple(trainer_logps.shape)}, {tuple(rollout_logps.shape)}, {tuple(mask.shape)}"
        )
    if not cap > 0:
        raise ValueError(f"the importance-sampling cap must be > 0, got {cap}")
    if level not in IS_LEVELS:
        raise ValueError(f"level must be one of {IS_LEVELS}, got {level!r}")
    with torch.no_grad():
        diff = (trainer_logps - rollout_logps) * mask.to(trainer_logps.dtype)  # (B, T)
        diff = torch.nan_to_num(diff, nan=0.0)
        if level == "sequence":
            diff = diff.sum(-1, keepdim=True).expand_as(diff)  # (B, T): the row's log-ratio everywhere
        return torch.exp(diff).clamp(max=cap)


def weighted_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(B,)`` or ``(B, T)`` advantages times ``(B, T)`` weights ``>= 0`` -> ``(B, T)`` token advantages
    for :func:`rl.losses.policy_loss` (equal to weighting each token's clipped loss; module docstring)."""
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # (B, 1)
    if advantages.shape[0] != weights.shape[0] or advantages.shape[1] not in (1, weights.shape[1]):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} do not fit weights {tuple(weights.shape)}: expected "
            "(B,) or (B, T)"
        )
    if bool((weights < 0).any()):
        raise ValueError("importance weights must be >= 0")
    return advantages * weights.to(advantages.dtype)  # (B, T)


def is_metrics(weights: torch.Tensor, mask: torch.Tensor, *, cap: float) -> dict[str, float]:
    """Mean / min / max weight over response tokens and the fraction truncated at ``cap``."""
    w = weights[mask.bool()]
    if w.numel() == 0:
        return {}
    return {
        "is_weight_mean": float(w.mean()),
        "is_weight_min": float(w.min()),
        "is_weight_max": float(w.max()),
        "is_truncated_frac": float((w >= cap).float().mean()),
    }
