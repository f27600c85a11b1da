"""Per-token KL estimators and entropy (pure functions).

KL estimators follow J. Schulman, "Approximating KL Divergence" (2020 blog post,
http://joschu.net/blog/kl-approx.html). With samples ``y ~ pi`` (the policy) and
``log r = log pi_ref(y) - log pi(y)``:

- ``k1 = -log r = log pi - log pi_ref``: unbiased for KL(pi || pi_ref), high variance, can be < 0.
- ``k2 = (log r)^2 / 2``: biased, low variance, always >= 0.
- ``k3 = (r - 1) - log r``: unbiased, low variance, always >= 0 (GRPO, Shao et al. 2024, eq. 4;
  TRL's ``GRPOTrainer`` uses exactly this, unclamped).
- ``low_var_kl``: verl's name for k3 with the log-ratio clamped to [-20, 20] and the result clamped
  to [-10, 10] (``verl.trainer.ppo.core_algos.kl_penalty``), which keeps bf16 training finite.
"""

from __future__ import annotations

import torch

__all__ = ["KL_KINDS", "entropy_from_logits", "kl_estimate"]

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


def kl_estimate(logps: torch.Tensor, ref_logps: torch.Tensor, *, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from log-probs of sampled tokens.

    Args:
        logps: ``(B, T)`` log pi(y_t) of the current policy (gradients flow through it).
        ref_logps: ``(B, T)`` log pi_ref(y_t) of the reference policy.
        kind: one of ``KL_KINDS`` (see module docstring).

    Returns:
        ``(B, T)`` per-token estimates; mask and aggregate them with ``rl.losses.aggregate_loss``.
    """
    if logps.shape != ref_logps.shape:
        raise ValueError(
            f"logps and ref_logps must match; got {tuple(logps.shape)} vs {tuple(ref_logps.shape)}"
        )
    if kind == "k1":
        return logps - ref_logps
    if kind == "k2":
        return 0.5 * (logps - ref_logps) ** 2
    if kind == "k3":
        log_r = ref_logps - logps
        return torch.exp(log_r) - log_r - 1
    if kind == "low_var_kl":
        log_r = torch.clamp(ref_logps - logps, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_r) - log_r - 1, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_KINDS}")


def entropy_from_logits(logits: torch.Tensor, *, chunk_size: int = 128) -> torch.Tensor:
    """Shannon entropy (nats) of ``softmax(logits)`` along the last axis: ``(..., V) -> (...)``.

    ``H = logsumexp(z) - sum_v softmax(z)_v z_v``, computed on chunks of ``chunk_size`` rows so the
    softmax of the whole batch is never held at once (same result as TRL's ``entropy_from_logits``).
    Half-precision logits are upcast to float32 per chunk.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    lead_shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    out_dtype = logits.dtype if logits.dtype in (torch.float32, torch.float64) else torch.float32
    parts = []
    for chunk in flat.split(chunk_size, dim=0):
        chunk = chunk.to(out_dtype)  # (n, V)
        probs = torch.softmax(chunk, dim=-1)
        parts.append(torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(-1))
    if not parts:
        return torch.zeros(lead_shape, dtype=out_dtype, device=logits.device)
    return torch.cat(parts).reshape(lead_shape)
