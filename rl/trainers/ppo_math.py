"""Pure pieces of ``rl ppo``: per-token rewards, explained variance, the minibatch plan of a rollout."""

from __future__ import annotations

import torch

from rl.advantages import masked_var


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` column of each row's last response token in a ``(B, T)`` mask (-1 for an empty row)."""
    T = mask.shape[1]
    idx = T - 1 - mask.flip(1).to(torch.long).argmax(1)  # (B,)
    return torch.where(mask.bool().any(1), idx, torch.full_like(idx, -1))


def token_rewards(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    credits: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """``(B, T)`` per-token rewards: ``credits`` (the dense per-mention credit, already weighted) on the
    tokens that earned them, the sequence score ``scores`` ``(B,)`` on each row's last response token, and
    ``-kl_coef * kl`` on every response token (KL as reward shaping, Ziegler et al. 2019; InstructGPT).

    Everything off the response ``mask`` is 0; the dtype is ``scores``' (float32 for integer scores).
    """
    if mask.dim() != 2 or scores.shape != mask.shape[:1]:
        raise ValueError(f"need scores (B,) and mask (B, T); got {tuple(scores.shape)}, {tuple(mask.shape)}")
    for name, t in (("credits", credits), ("kl", kl)):
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{name} must be (B, T) = {tuple(mask.shape)}; got {tuple(t.shape)}")
    m = mask.to(scores.dtype if scores.is_floating_point() else torch.float32)
    out = torch.zeros_like(m)  # (B, T)
    last = last_token_index(mask)  # (B,)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = scores[rows].to(out.dtype)
    if credits is not None:
        out = out + credits.to(out.dtype) * m
    if kl is not None and kl_coef:
        out = out - kl_coef * kl.to(out.dtype) * m
    return out


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over the masked tokens (cleanrl, SB3): 1 is a perfect
    critic, 0 one no better than a constant, < 0 worse. NaN when the returns do not vary (as SB3)."""
    if not (values.shape == returns.shape == mask.shape):
        raise ValueError(
            f"values, returns and mask must match; got {tuple(values.shape)}, {tuple(returns.shape)}, "
            f"{tuple(mask.shape)}"
        )
    v, r = values.detach().double(), returns.detach().double()
    var_r = float(masked_var(r, mask))
    if var_r == 0:
        return float("nan")
    return 1.0 - float(masked_var(r - v, mask)) / var_r


def minibatch_plan(rows: int, *, epochs: int, minibatches: int, seed: int) -> list[torch.Tensor]:
    """Row indices of every update of a rollout of ``rows`` rows: ``epochs`` passes, each a fresh random
    permutation (a generator seeded by ``seed``) cut into ``minibatches`` equal slices."""
    if rows % minibatches:
        raise ValueError(f"{rows} rollout rows do not split into {minibatches} equal minibatches")
    g = torch.Generator().manual_seed(seed)
    size = rows // minibatches
    plan = []
    for _ in range(epochs):
        perm = torch.randperm(rows, generator=g)
        plan.extend(perm[i * size : (i + 1) * size] for i in range(minibatches))
    return plan
