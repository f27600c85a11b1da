"""The SFT loss: next-token cross-entropy on answer tokens, weighted per sample kind, divided so that
data-parallel ranks average to the global batch's token mean."""

from __future__ import annotations

from typing import Any

import torch

from mm.eval.claims.extract import COLOR_WORDS
from mm.train.common import all_reduce_sum
from mm.train.sft.config import TaskConfig
from mm.train.token_loss import answer_positions_loss, token_weights


def answer_loss(
    model: Any, batch: dict[str, Any], weights: torch.Tensor | None, divisor: torch.Tensor
) -> torch.Tensor:
    """The SFT loss of ``batch`` (collated, with ``labels``) with logits computed at answer positions only.

    Equals ``model(**batch, num_items_in_batch=divisor).loss`` (or :func:`weighted_token_loss` with
    ``weights``); a PEFT model is unwrapped to its base, whose modules hold the adapters.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    hidden = base.model(**inputs).last_hidden_state  # (B, T, D)
    return answer_positions_loss(hidden, base.lm_head, batch["labels"], weights, divisor)


QUESTION_KINDS = ("question", "pope_question", "attribute_question")
"""Sample kinds whose answer tokens get ``tasks.question_weight``."""


def sample_weights(data: Any, indices: Any, tasks: TaskConfig) -> torch.Tensor:
    """(B,) loss weight of each sample of a batch: ``tasks.question_weight`` for yes/no questions, else 1."""
    w = [tasks.question_weight if data.samples[i].kind in QUESTION_KINDS else 1.0 for i in indices]
    return torch.tensor(w, dtype=torch.float32)


def colour_token_ids(tokenizer: Any) -> torch.Tensor:
    """Ids of the tokens whose text is a colour word (:data:`mm.eval.claims.extract.COLOR_WORDS`: " red",
    "red", "Red"), the tokens ``tasks.colour_weight`` weighs. A colour the tokenizer splits into several
    tokens has none."""
    words = set(COLOR_WORDS)
    vocab = tokenizer.get_vocab()
    ids = [i for i in vocab.values() if tokenizer.decode([i]).strip().lower() in words]
    return torch.tensor(sorted(ids), dtype=torch.long)


def batch_weights(
    data: Any, indices: Any, labels: torch.Tensor, tasks: TaskConfig, colour_ids: torch.Tensor | None
) -> torch.Tensor | None:
    """The loss weights of a batch with ``labels`` (B, T) of samples ``indices``: None when every weight is
    1, (B,) per sample (``tasks.question_weight``), or (B, T-1) per token when ``tasks.colour_weight`` also
    weighs the colour words (``colour_ids``, :func:`colour_token_ids`)."""
    per_sample = None if tasks.question_weight == 1.0 else sample_weights(data, indices, tasks)
    if tasks.colour_weight == 1.0:
        return per_sample
    if per_sample is None:
        per_sample = torch.ones(len(labels), dtype=torch.float32)
    return token_weights(labels, per_sample, heavy_ids=colour_ids, heavy_weight=tasks.colour_weight)


def mean_answer_tokens(data: Any, tasks: TaskConfig, colour_ids: torch.Tensor | None = None) -> float:
    """Mean answer tokens of a training sample, each weighted as :func:`batch_weights` weighs it (what a
    random batch's :func:`answer_token_divisor` is, per sample, in expectation)."""
    weights = sample_weights(data, range(len(data.samples)), tasks).double()  # (N,)
    total = 0.0
    for w, labels in zip(weights.tolist(), data.labels):
        tw = token_weights(
            labels[None], torch.tensor([w], dtype=torch.float64), heavy_ids=colour_ids,
            heavy_weight=tasks.colour_weight,
        )  # fmt: skip  # (1, T-1)
        total += float(tw.sum())
    return max(total / max(len(data.labels), 1), 1.0)


def answer_token_divisor(
    labels: torch.Tensor, world: int, sample_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """What this rank divides its summed token loss by, so that training matches one process.

    ``labels`` (B, T) of this rank's shard (-100 = ignored; the loss predicts ``labels[:, 1:]``). With N
    answer tokens in the global batch (summed over ranks), the divisor is N / world: rank r's loss is
    sum_r / (N / W), DDP averages the W gradients, and the result is the gradient of sum / N, the token
    mean over the global batch that one process computes. (A per-rank token mean would weight a token of
    a rank with few answer tokens more than one of a rank with many.) At least 1 token is assumed.
    With ``sample_weights`` (B,) or (B, T-1), N is the weighted token count
    (mm.train.token_loss.token_weights).
    """
    if sample_weights is None:
        n = (labels[:, 1:] != -100).sum().to(torch.float32)
    elif sample_weights.dim() == 2:
        n = sample_weights.to(torch.float32).sum()
    else:
        n = token_weights(labels, sample_weights.to(torch.float32)).sum()
    n = all_reduce_sum(n)  # N over all ranks
    return n.clamp(min=1.0) / world
