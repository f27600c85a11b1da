"""Remedies for entropy collapse in policy-gradient RL, as pure tensor functions.

- :func:`entropy_bonus`: the aggregated token entropy, subtracted from the loss with a weight (verl's
  ``entropy_coeff``: ``loss = pg_loss - coef * agg(entropy)``).
- :func:`clip_cov_loss` / :func:`kl_cov_loss`: Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy
  Mechanism of Reinforcement Learning for Reasoning Language Models"), verl's ``loss_mode`` "clip_cov" and
  "kl_cov": the tokens whose centred ``A * log pi`` covariance is largest drive entropy down; Clip-Cov
  drops the gradient of a random few of them, KL-Cov adds ``|log pi - log pi_old|`` to the top share.
- :func:`forking_mask`: train only on the top-rho share of response tokens by entropy (Wang et al. 2025,
  "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL for LLM Reasoning").
- :func:`remedied_policy_loss`: the GRPO policy loss with the above switched by ``AlgoConfig`` fields.

Log-ratios are clamped to [-20, 20] before ``exp`` as in :func:`rl.losses.policy_loss` (verl does not
clamp in the two covariance losses; equal on any input whose log-ratios lie inside the clamp).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rl.losses import aggregate_loss, policy_loss, token_advantages

__all__ = [
    "LOSS_MODES",
    "REMEDY_KEYS",
    "clip_cov_loss",
    "entropy_bonus",
    "forking_mask",
    "kl_cov_loss",
    "remedied_policy_loss",
    "sampled_entropy_surrogate",
]

LOSS_MODES = ("clip", "clip_cov", "kl_cov")
REMEDY_KEYS = ("clip_cov_frac", "kl_cov_frac", "forking_frac")
"""Token-averaged metrics the remedies add (each present only when its remedy is on)."""


def _masked_mean(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    k = keep.to(x.dtype)
    return (x * k).sum() / k.sum().clamp(min=1.0)


def _clip_fracs(
    w: torch.Tensor | None, adv: torch.Tensor, valid: torch.Tensor, eps_low: float, eps_high: float
) -> dict[str, torch.Tensor]:
    """The clip fractions :func:`rl.losses.policy_loss` reports (all 0 for ``w=None``: nothing clipped)."""
    zero = torch.zeros_like(adv)
    if w is None:
        return {k: _masked_mean(zero, valid) for k in ("clip_frac_low", "clip_frac_high", "clip_frac_dual")}
    return {
        "clip_frac_low": _masked_mean(((w < 1 - eps_low) & (adv < 0)).to(adv.dtype), valid),
        "clip_frac_high": _masked_mean(((w > 1 + eps_high) & (adv > 0)).to(adv.dtype), valid),
        "clip_frac_dual": _masked_mean(zero, valid),
    }


def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor, *, agg: str = "token-mean", horizon: int | None = None
) -> torch.Tensor:
    """The entropy term ``agg(entropy)`` over the response tokens; the loss subtracts ``coef`` times it.

    ``entropy`` ``(B, T)`` in nats (with a gradient when it should train), ``mask`` ``(B, T)``.
    """
    if entropy.shape != mask.shape or entropy.dim() != 2:
        raise ValueError(
            f"entropy and mask must both be (B, T); got {tuple(entropy.shape)}, {tuple(mask.shape)}"
        )
    return aggregate_loss(entropy, mask, mode=agg, horizon=horizon)


def sampled_entropy_surrogate(entropy: torch.Tensor, logps: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` tensor equal to ``entropy`` whose gradient is the score-function estimate of the
    entropy's: ``grad H = -E_y[log pi(y) grad log pi(y)]``, one sampled token per position.

    For scorers that return the entropy detached (:func:`rl.trainers.common.batch_token_logps`); unbiased
    per position for on-policy samples, noisier than differentiating the logits' entropy as verl does.
    """
    if entropy.shape != logps.shape:
        raise ValueError(
            f"entropy and logps must have one shape; got {tuple(entropy.shape)}, {tuple(logps.shape)}"
        )
    score = -logps.detach() * logps  # (B, T); grad = -log pi * grad log pi
    return entropy.detach() + score - score.detach()


def forking_mask(entropy: torch.Tensor, mask: torch.Tensor, top: float) -> torch.Tensor:
    """``(B, T)`` bool: the ``ceil(top * n)`` response tokens of highest entropy among the batch's ``n``.

    ``top`` in (0, 1]; ``top=1`` returns ``mask`` (as bool) unchanged. Ties at the threshold are broken
    by ``torch.topk`` (exactly ``ceil(top * n)`` tokens are kept).
    """
    if not 0 < top <= 1:
        raise ValueError(f"forking top share must be in (0, 1], got {top}")
    if entropy.shape != mask.shape or entropy.dim() != 2:
        raise ValueError(
            f"entropy and mask must both be (B, T); got {tuple(entropy.shape)}, {tuple(mask.shape)}"
        )
    keep = mask.bool()
    n = int(keep.sum())
    if top == 1 or n == 0:
        return keep
    k = max(1, math.ceil(top * n))
    flat = entropy.detach().reshape(-1).masked_fill(~keep.reshape(-1), -math.inf)  # (B*T,)
    idx = torch.topk(flat, k).indices
    out = torch.zeros_like(keep).reshape(-1)
    out[idx] = True
    return out.reshape(keep.shape)


def clip_cov_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    ratio: float = 0.0002,
    lb: float = 1.0,
    ub: float = 5.0,
    agg: str = "token-mean",
    horizon: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (verl ``compute_policy_loss_clip_cov``): PPO-clip, with the gradient of
    ``max(int(ratio * n), 1)`` tokens set to zero, drawn at random (``torch.randperm``, ``generator``)
    among the response tokens not already clipped whose covariance
    ``(A - mean A) * (log pi - mean log pi)`` (means over the response tokens) lies in ``(lb, ub)``.

    Defaults are verl's (``clip_cov_ratio`` 2e-4, ``clip_cov_lb`` 1, ``clip_cov_ub`` 5). Inputs as
    :func:`rl.losses.policy_loss`. Returns ``(loss, metrics)``: ``policy_loss``'s clip fractions,
    ``clip_cov_frac`` (share of response tokens
    whose gradient was dropped, verl's ``pg_clipfrac``) and ``approx_kl``.
    """
    eps_high = eps_low if eps_high is None else eps_high
    adv = token_advantages(logps, old_logps, advantages, mask)  # (B, T)
    if ratio <= 0 or lb >= ub:
        raise ValueError(f"Clip-Cov needs ratio > 0 and lb < ub; got ratio={ratio}, lb={lb}, ub={ub}")
    valid = mask > 0  # (B, T)
    log_ratio = (logps - old_logps).clamp(min=-20.0, max=20.0)
    w = torch.exp(log_ratio)  # (B, T)
    loss1 = -adv * w
    loss2 = -adv * w.clamp(1 - eps_low, 1 + eps_high)
    with torch.no_grad():
        clipped = (loss2 > loss1) & valid
        cov = (adv - _masked_mean(adv, valid)) * (logps - _masked_mean(logps, valid))  # (B, T)
        cand = torch.nonzero(valid & ~clipped & (cov > lb) & (cov < ub))  # (N, 2)
        n_drop = max(int(ratio * valid.sum().item()), 1)
        corr = torch.ones_like(adv)
        if len(cand) > 0:
            cand = cand[torch.randperm(len(cand), generator=generator)[: min(n_drop, len(cand))]]
            corr[cand[:, 0], cand[:, 1]] = 0
    per_token = torch.maximum(loss1, loss2) * corr  # (B, T)
    loss = aggregate_loss(per_token, mask, mode=agg, horizon=horizon)
    metrics = {
        **_clip_fracs(w.detach(), adv, valid, eps_low, eps_high),
        "clip_cov_frac": _masked_mean((corr == 0).to(logps.dtype), valid),
        "approx_kl": _masked_mean((old_logps - logps).detach(), valid),
    }
    return loss, metrics


def kl_cov_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ratio: float = 0.0002,
    kl_coef: float = 1.0,
    agg: str = "token-mean",
    horizon: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (verl ``compute_policy_loss_kl_cov``): the unclipped ``-A w`` per token, plus
    ``kl_coef * |log pi - log pi_old|`` on the ``max(1, int(ratio * n))`` response tokens of largest
    covariance ``(A - mean A) * (log pi - mean log pi)`` (``torch.topk``; no clipping anywhere).

    Defaults are verl's (``kl_cov_ratio`` 2e-4, ``ppo_kl_coef`` 1). Returns ``(loss, metrics)``: clip
    fractions (0), ``kl_cov_frac`` (share of response tokens penalised) and ``approx_kl_abs`` (masked mean of
    ``|log pi - log pi_old|``, verl's ``ppo_kl``).
    """
    adv = token_advantages(logps, old_logps, advantages, mask)  # (B, T)
    if ratio <= 0 or kl_coef < 0:
        raise ValueError(f"KL-Cov needs ratio > 0 and kl_coef >= 0; got ratio={ratio}, kl_coef={kl_coef}")
    valid = mask > 0  # (B, T)
    log_ratio = (logps - old_logps).clamp(min=-20.0, max=20.0)
    abs_kl = log_ratio.abs()
    per_token = -adv * torch.exp(log_ratio)  # (B, T)
    with torch.no_grad():
        pick = torch.zeros_like(valid)
        a, lp = adv[valid], logps[valid]  # (n,)
        if a.numel() > 0:
            cov = (a - a.mean()) * (lp - lp.mean())  # (n,)
            top = torch.topk(cov, max(1, int(cov.numel() * ratio))).indices
            flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0][top]
            pick.view(-1)[flat] = True
    per_token = torch.where(pick, per_token + kl_coef * abs_kl, per_token)
    loss = aggregate_loss(per_token, mask, mode=agg, horizon=horizon)
    metrics = {
        **_clip_fracs(None, adv, valid, 0.0, 0.0),
        "kl_cov_frac": _masked_mean(pick.to(logps.dtype), valid),
        "approx_kl_abs": _masked_mean(abs_kl.detach(), valid),
        "approx_kl": _masked_mean((old_logps - logps).detach(), valid),
    }
    return loss, metrics


def remedied_policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    entropy: torch.Tensor,
    cfg: Any,
    *,
    horizon: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of ``cfg`` (an ``AlgoConfig``): ``cfg.loss_mode`` picks PPO-clip
    (:func:`rl.losses.policy_loss`), :func:`clip_cov_loss` or :func:`kl_cov_loss`; ``cfg.forking_top < 1``
    trains only on :func:`forking_mask`'s tokens; ``cfg.entropy_coef > 0`` subtracts ``coef`` times
    :func:`entropy_bonus` of :func:`sampled_entropy_surrogate` over all response tokens.

    With the defaults (``clip``, 1.0, 0.0) this is exactly ``policy_loss`` with ``cfg``'s clip options.
    ``entropy`` ``(B, T)`` is the scorer's (detached) entropy.
    """
    train_mask = mask if cfg.forking_top == 1 else forking_mask(entropy, mask, cfg.forking_top)
    if cfg.loss_mode == "clip":
        loss, metrics = policy_loss(
            logps, old_logps, advantages, train_mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
            dual_clip=cfg.dual_clip, level=cfg.level, agg=cfg.agg, horizon=horizon,
        )  # fmt: skip
    elif cfg.loss_mode == "clip_cov":
        loss, metrics = clip_cov_loss(
            logps, old_logps, advantages, train_mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
            ratio=cfg.clip_cov_ratio, lb=cfg.clip_cov_lb, ub=cfg.clip_cov_ub, agg=cfg.agg, horizon=horizon,
        )  # fmt: skip
    elif cfg.loss_mode == "kl_cov":
        loss, metrics = kl_cov_loss(
            logps, old_logps, advantages, train_mask, ratio=cfg.kl_cov_ratio, kl_coef=cfg.ppo_kl_coef,
            agg=cfg.agg, horizon=horizon,
        )  # fmt: skip
    else:
        raise ValueError(f"unknown loss_mode {cfg.loss_mode!r}; expected one of {LOSS_MODES}")
    if cfg.forking_top != 1:
        metrics["forking_frac"] = _masked_mean(train_mask.to(logps.dtype), mask > 0)
    if cfg.entropy_coef > 0:
        bonus = entropy_bonus(sampled_entropy_surrogate(entropy, logps), mask, agg=cfg.agg, horizon=horizon)
        loss = loss - cfg.entropy_coef * bonus
    return loss, metrics
