"""Pure tensor helpers of the adapters: prompt + answer batches, per-token log-probs, trimming at eos.

Layout of an answer batch (one row per sample; ``P`` prompt columns, ``A`` answer columns):

    [pad ... pad  prompt tokens][answer tokens  pad ... pad]
     <----- left padded, P ---->  <--- right padded, A --->

The prompt part is exactly what generation feeds the model (left padded, chat-template generation
prompt at the end), and the answer part is what generation would have appended, so the log-probs of a
sampled answer equal the ones at sampling time. ``response_mask`` is 1 exactly on answer tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

TOKEN_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
"""Per-token (B, T) inputs a processor may return; every one is extended over the answer columns."""


def append_answers(
    prompts: dict[str, Any], answer_ids: Sequence[Sequence[int]], *, pad_token_id: int
) -> dict[str, Any]:
    """``prompts`` (left-padded processor output, (B, P) token inputs) + answers -> (B, P + A) batch.

    Token inputs (:data:`TOKEN_KEYS`) get the answer appended after each row's prompt: ``input_ids`` the
    answer ids then ``pad_token_id``; ``attention_mask`` 1 on the answer then 0; the others 0 (text
    tokens). Image inputs (``pixel_values``, ``image_grid_thw``, ...) are passed through unchanged. Adds
    ``response_mask`` (B, P + A), 1 exactly on answer tokens.
    """
    ids = prompts["input_ids"]  # (B, P)
    B, P = ids.shape
    if len(answer_ids) != B:
        raise ValueError(f"need one answer per sample: {B} prompts, got {len(answer_ids)} answers")
    attn = prompts["attention_mask"]
    if bool((attn[:, -1] == 0).any()):
        raise ValueError("prompts must be left padded (the last column is padding in some row)")
    empty = [i for i, a in enumerate(answer_ids) if len(a) == 0]
    if empty:
        raise ValueError(f"answers {empty} have no tokens: an answer needs at least one token to score")
    A = max(len(a) for a in answer_ids)
    answer = torch.full((B, A), pad_token_id, dtype=ids.dtype)  # (B, A)
    answer_mask = torch.zeros(B, A, dtype=attn.dtype)  # (B, A)
    for b, a in enumerate(answer_ids):
        answer[b, : len(a)] = torch.as_tensor(list(a), dtype=ids.dtype)
        answer_mask[b, : len(a)] = 1
    answer, answer_mask = answer.to(ids.device), answer_mask.to(attn.device)
    out = dict(prompts)
    for key in TOKEN_KEYS:
        if key not in prompts:
            continue
        value = prompts[key]
        if tuple(value.shape) != (B, P):
            raise ValueError(f"{key} must be (B, P)=({B}, {P}) like input_ids, got {tuple(value.shape)}")
        tail = {"input_ids": answer, "attention_mask": answer_mask}.get(key)
        if tail is None:
            tail = torch.zeros(B, A, dtype=value.dtype, device=value.device)
        out[key] = torch.cat([value, tail.to(value.dtype)], dim=1)  # (B, P + A)
    out["response_mask"] = torch.cat([torch.zeros_like(attn), answer_mask], dim=1)  # (B, P + A)
    return out


def padded_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions (B, T) as `generate` builds them for left padding: ``cumsum(mask) - 1``, 0 on padding."""
    positions = attention_mask.long().cumsum(-1) - 1  # (B, T)
    return positions.masked_fill(attention_mask == 0, 0)


def first_response_column(response_mask: torch.Tensor) -> int:
    """First column holding a response token in any row (>= 1: every row needs a prompt token before it)."""
    cols = response_mask.any(dim=0).nonzero()
    if len(cols) == 0:
        raise ValueError("response_mask is all 0: the batch has no answer token to score")
    start = int(cols[0])
    if start < 1:
        raise ValueError("an answer cannot start at position 0: every sequence needs a prompt token")
    return start


def gather_logps(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at ``targets``: (B, W, V), (B, W) -> (B, W) float32."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits must be targets.shape + (V,): expected {tuple(targets.shape)} + (V,), "
            f"got {tuple(logits.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    picked = z.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (B, W)
    return picked - torch.logsumexp(z, dim=-1)


def trim_at_eos(rows: torch.Tensor, eos_ids: Sequence[int]) -> list[list[int]]:
    """Generated ids (B, R) -> per row the ids up to and including the first eos (the rest is padding)."""
    eos = {int(e) for e in eos_ids}
    out: list[list[int]] = []
    for row in rows.tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        out.append(row[:end])
    return out
