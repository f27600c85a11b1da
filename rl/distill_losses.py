"""Distillation losses (pure): reverse KL on the student's own samples, the generalised JSD of GKD, SFT.

Notation: ``s`` the student, ``t`` the teacher, logits ``(B, W, V)`` over an answer window of ``W``
tokens, ``p = softmax(logits / temperature)``; a mask ``(B, W)`` is 1 on answer tokens.

- Reverse KL, full vocabulary (Gu et al. 2024, "MiniLLM"; Agarwal et al. 2024, "On-Policy
  Distillation of Language Models", GKD, beta = 1): per token ``KL(p_s || p_t) = sum_v p_s (log p_s -
  log p_t)`` (:func:`reverse_kl_per_token`), averaged over answer tokens (:func:`reverse_kl_loss`).
- Reverse KL, sampled token (the on-policy distillation recipe of Lu & Thinking Machines 2025): the
  per-token advantage ``A_t = -(log p_s(y_t) - log p_t(y_t))`` of the token the student sampled
  (:func:`reverse_kl_advantages`), used in an on-policy policy-gradient loss (:func:`sampled_kl_loss`);
  its expected gradient is the gradient of the reverse KL of the sequence.
- Generalised JSD (GKD eq. 1): ``JSD_beta = beta KL(p_t || m) + (1 - beta) KL(p_s || m)``,
  ``m = beta p_t + (1 - beta) p_s``; at ``beta = 0`` the forward ``KL(p_t || p_s)``, at ``beta = 1`` the
  reverse ``KL(p_s || p_t)`` (the limits of ``JSD_beta / beta`` and ``JSD_beta / (1 - beta)``, not of
  ``JSD_beta``, which vanishes at both ends). :func:`generalized_jsd_loss` equals TRL's
  ``GKDTrainer.generalized_jsd_loss`` (labels with -100, reductions) to float64 precision.
- SFT on teacher samples (sequence-level KD, Kim & Rush 2016): the token-mean NLL (:func:`sft_loss`).
"""

from __future__ import annotations

import torch

REDUCTIONS = ("batchmean", "sum", "mean", "none")
"""Reductions of :func:`generalized_jsd_loss` (TRL's)."""


def _check_pair(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> None:
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            "student and teacher logits must have the same shape (B, W, V) (same vocabulary, same answer "
            f"tokens): got {tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        )


def log_probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` over the last axis; float64 stays float64, else float32."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = logits if logits.dtype == torch.float64 else logits.float()
    return torch.log_softmax(z / temperature if temperature != 1.0 else z, dim=-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` ``(B, W)`` over ``mask == 1`` (0 when the mask is empty)."""
    if values.shape != mask.shape:
        raise ValueError(f"values and mask must have the same shape, got {tuple(values.shape)} and "
                         f"{tuple(mask.shape)}")  # fmt: skip
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1)


def reverse_kl_per_token(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """``KL(p_s || p_t)`` at every position: ``(B, W, V)`` x 2 -> ``(B, W)`` (nats, >= 0)."""
    _check_pair(student_logits, teacher_logits)
    ls = log_probs(student_logits, temperature)  # (B, W, V)
    lt = log_probs(teacher_logits, temperature).to(ls.dtype)  # (B, W, V)
    return (ls.exp() * (ls - lt)).sum(-1)  # (B, W)


def reverse_kl_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Token-mean of :func:`reverse_kl_per_token` over the answer tokens (``mask`` ``(B, W)``)."""
    return masked_mean(reverse_kl_per_token(student_logits, teacher_logits, temperature=temperature), mask)


def reverse_kl_advantages(
    student_logps: torch.Tensor, teacher_logps: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-token advantages ``-(log p_s(y_t) - log p_t(y_t))`` ``(B, W)`` of the sampled tokens, detached,
    0 off the mask (the on-policy distillation recipe: the teacher's per-token reward)."""
    if not student_logps.shape == teacher_logps.shape == mask.shape:
        raise ValueError(
            f"student_logps, teacher_logps and mask must all be (B, W), got {tuple(student_logps.shape)}, "
            f"{tuple(teacher_logps.shape)}, {tuple(mask.shape)}"
        )
    adv = -(student_logps.detach() - teacher_logps.detach().to(student_logps.dtype))
    return adv.masked_fill(mask == 0, 0.0)


def sampled_kl_loss(
    student_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """On-policy policy-gradient loss ``-mean_t(A_t * ratio_t)`` with ``ratio = exp(logp - logp.detach())``
    (1 in value, ``grad logp`` in gradient): its value is the sampled reverse-KL estimate ``mean(-A)`` and
    its gradient ``-mean(A grad log p_s)``. ``student_logps``, ``advantages``, ``mask``: ``(B, W)``."""
    ratio = torch.exp(student_logps - student_logps.detach())  # (B, W), 1 in value
    return masked_mean(-advantages.detach().to(ratio.dtype) * ratio, mask)


def sft_loss(student_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean negative log-likelihood of the answer tokens: ``(B, W)`` log-probs and mask -> scalar."""
    return masked_mean(-student_logps, mask)


def gjsd_terms(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, *, beta: float = 0.5, temperature: float = 1.0
) -> torch.Tensor:
    """Per-vocabulary-entry terms ``(B, W, V)`` of the generalised JSD (summing over V gives the per-token
    divergence). ``beta = 0``: forward KL terms ``p_t (log p_t - log p_s)``; ``beta = 1``: reverse KL terms
    ``p_s (log p_s - log p_t)``; else ``beta p_t (log p_t - log m) + (1 - beta) p_s (log p_s - log m)``."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (0: forward KL, 1: reverse KL), got {beta}")
    _check_pair(student_logits, teacher_logits)
    ls = log_probs(student_logits, temperature)  # (B, W, V)
    lt = log_probs(teacher_logits, temperature).to(ls.dtype)  # (B, W, V)
    if beta == 0:
        return lt.exp() * (lt - ls)
    if beta == 1:
        return ls.exp() * (ls - lt)
    b = torch.tensor(beta, dtype=ls.dtype, device=ls.device)
    lm = torch.logaddexp(ls + torch.log1p(-b), lt + torch.log(b))  # (B, W, V): log m
    return b * lt.exp() * (lt - lm) + (1 - b) * ls.exp() * (ls - lm)


def generalized_jsd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """The generalised JSD with TRL's conventions (``GKDTrainer.generalized_jsd_loss``).

    ``labels`` ``(B, W)``: positions with -100 are dropped (the terms become ``(N, V)``, N kept positions).
    Reduction: ``num_items_in_batch`` given -> sum / it; else ``batchmean`` -> sum / N (labels given,
    N clamped to >= 1) or sum / B (no labels); ``sum``; ``mean`` (over every kept (position, vocab) entry,
    as TRL); ``none`` -> the terms themselves.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    terms = gjsd_terms(student_logits, teacher_logits, beta=beta, temperature=temperature)  # (B, W, V)
    keep = None
    if labels is not None:
        if labels.shape != terms.shape[:-1]:
            raise ValueError(f"labels must be (B, W)={tuple(terms.shape[:-1])}, got {tuple(labels.shape)}")
        keep = labels != -100  # (B, W)
        terms = terms[keep]  # (N, V)
    if num_items_in_batch is not None:
        total = terms.sum()
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch
    if reduction == "batchmean":
        denom = keep.sum().clamp_min(1) if keep is not None else max(terms.shape[0], 1)
        return terms.sum() / denom
    if reduction == "sum":
        return terms.sum()
    if reduction == "mean":
        return terms.mean()
    return terms


def gjsd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Token-mean generalised JSD over the answer tokens (``mask`` ``(B, W)``): TRL's ``batchmean`` with
    labels -100 off the mask."""
    per_token = gjsd_terms(student_logits, teacher_logits, beta=beta, temperature=temperature).sum(-1)
    return masked_mean(per_token, mask)  # (B, W) -> scalar
