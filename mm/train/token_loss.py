"""Weighted next-token cross-entropy: the SFT loss with a weight per sample (e.g. per task kind).

With every weight 1 this is the token mean that ``NoteVLMForConditionalGeneration``'s own loss computes
(transformers' ``ForCausalLMLoss`` with ``num_items_in_batch``). A yes/no question has one answer token
(plus the end token) against ~40 for a caption, so in a token mean over a mixed batch the questions carry
~5% of the gradient; ``tasks.question_weight`` scales their tokens up (the divisor counts the weights,
so the loss stays a weighted mean).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_weights(
    labels: torch.Tensor,
    sample_weights: torch.Tensor,
    *,
    heavy_ids: torch.Tensor | None = None,
    heavy_weight: float = 1.0,
) -> torch.Tensor:
    """(B, T-1) weight of each predicted token: ``sample_weights[b]`` where labels[b, 1:] != -100, else 0;
    a token whose id is in ``heavy_ids`` (e.g. the colour words, ``tasks.colour_weight``) has it times
    ``heavy_weight``."""
    target = labels[:, 1:]  # (B, T-1)
    w = (target != -100).to(sample_weights.dtype) * sample_weights[:, None]  # (B, T-1)
    if heavy_ids is not None and heavy_weight != 1.0:
        heavy = torch.isin(target, heavy_ids.to(target.device))  # (B, T-1)
        w = torch.where(heavy, w * heavy_weight, w)
    return w


def weighted_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    sample_weights: torch.Tensor | None,
    divisor: torch.Tensor | float,
) -> torch.Tensor:
    """sum_b,t w[b] * CE(logits[b, t], labels[b, t+1]) / divisor.

    logits (B, T, V); labels (B, T), -100 = not an answer token, shifted here as in transformers;
    sample_weights (B,), or (B, T-1) per predicted token (:func:`token_weights`), or None (all 1).
    ``divisor``: the summed token weights of the (global) batch, see :func:`token_weights`; pass the weight
    sum over all ranks divided by the world size under DDP.
    """
    return answer_positions_loss(logits, torch.nn.Identity(), labels, sample_weights, divisor)


def answer_positions_loss(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    labels: torch.Tensor,
    sample_weights: torch.Tensor | None,
    divisor: torch.Tensor | float,
) -> torch.Tensor:
    """:func:`weighted_token_loss` with the LM head applied only where there is an answer token.

    hidden (B, T, D): the LM's last hidden states; labels (B, T) as above; sample_weights (B,), (B, T-1)
    per predicted token, or None (all 1). Same value as running the head over every position (the prompt
    and image positions are masked out of the loss anyway), at a fraction of the cost: the head is D x V
    per position and only ~1/4 of a note's positions are answer tokens.
    """
    target = labels[:, 1:]  # (B, T-1)
    keep = target != -100  # (B, T-1)
    logits = lm_head(hidden[:, :-1][keep])  # (N, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    ce = F.cross_entropy(logits, target[keep], reduction="none")  # (N,)
    if sample_weights is not None:
        w = sample_weights.to(ce.dtype)
        ce = ce * (w if w.dim() == 2 else w[:, None]).expand_as(target)[keep]
    return ce.sum() / divisor
