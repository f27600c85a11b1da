"""How on-policy a pair is: the policy's mean log-probability per response token of each side.

``chosen_logp`` / ``rejected_logp`` through :mod:`rl.logprobs`; the rejected side of a corrupt pair is
scored with the corrupted images (:func:`rl.pairs.corruption.pair_images`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mm.model.processing import IGNORE_INDEX
from rl.logprobs import causal_token_logprobs, sequence_logprob
from rl.pairs.corruption import pair_images
from rl.pairs.record import PreferencePair


def _response_sample(
    processor: Any, images: Sequence[Any], prompt: str, response: str | Sequence[int]
) -> dict:
    """Processor sample whose labels mark exactly the response tokens (text + eos, or raw ids)."""

    if isinstance(response, str):
        return processor.encode(list(images), prompt, response)
    s = processor.encode(list(images), prompt)
    n_prompt = len(s["input_ids"])
    resp = torch.as_tensor(list(response), dtype=torch.long)[
        : max(0, processor.max_length - n_prompt)
    ]  # (R,)
    s["input_ids"] = torch.cat([s["input_ids"], resp])  # (T,)
    s["attention_mask"] = torch.ones_like(s["input_ids"])
    s["labels"] = torch.full_like(s["input_ids"], IGNORE_INDEX)
    s["labels"][n_prompt:] = resp
    return s


def policy_logps(
    model: Any,
    processor: Any,
    images: Sequence[Sequence[Any]],
    prompts: Sequence[str],
    responses: Sequence[str | Sequence[int]],
    *,
    batch_size: int = 16,
) -> list[float]:
    """Mean log-prob per response token of ``responses[i]`` (text, tokenised + eos, or raw ids)."""

    if not len(images) == len(prompts) == len(responses):
        raise ValueError(
            f"need one image list and prompt per response, got {len(images)}, {len(prompts)}, "
            f"{len(responses)}"
        )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[float] = []
    try:
        with torch.no_grad():
            for start in range(0, len(responses), batch_size):
                idx = range(start, min(len(responses), start + batch_size))
                batch = processor.collate(
                    [_response_sample(processor, images[i], prompts[i], responses[i]) for i in idx]
                )
                batch = {k: v.to(device) for k, v in batch.items()}
                labels = batch.pop("labels")  # (B, T)
                logits = model(**batch).logits.float()  # (B, T, V)
                mask = (labels != -100).long()  # (B, T)
                logps, m = causal_token_logprobs(logits, batch["input_ids"], mask)  # (B, T-1)
                out.extend(sequence_logprob(logps, m, reduce="mean").tolist())
    finally:
        model.train(was_training)
    return out


def add_logps(
    model: Any, processor: Any, pairs: Sequence[PreferencePair], root: str | Path, *, batch_size: int = 16
) -> None:
    """Fill ``chosen_logp`` / ``rejected_logp`` of ``pairs`` in place (corrupted images where recorded)."""
    chosen = policy_logps(
        model, processor, [pair_images(p, root) for p in pairs], [p.prompt for p in pairs],
        [p.chosen_ids if p.chosen_ids is not None else p.chosen for p in pairs], batch_size=batch_size,
    )  # fmt: skip
    rejected = policy_logps(
        model, processor, [pair_images(p, root, rejected=True) for p in pairs], [p.prompt for p in pairs],
        [p.rejected_ids if p.rejected_ids is not None else p.rejected for p in pairs], batch_size=batch_size,
    )  # fmt: skip
    for p, c, r in zip(pairs, chosen, rejected):
        p.chosen_logp, p.rejected_logp = float(c), float(r)
