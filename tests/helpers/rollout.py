"""A hand-built rollout of one caption (for per-token credit tests): 3 prompt tokens, then the ids."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def caption_rollout(response_ids: Sequence[int]):
    """A :class:`rl.trainers.rollout.Rollout` of one prompt (3 tokens of id 1) answered by ``response_ids``,
    untruncated, group size 1, every response position in the mask."""
    from rl.trainers.rollout import Rollout

    R = len(response_ids)
    prompt = torch.ones(1, 3, dtype=torch.long)
    resp, mask = torch.tensor([list(response_ids)]), torch.ones(1, R, dtype=torch.long)
    return Rollout(
        input_ids=torch.cat([prompt, resp], 1), attention_mask=torch.cat([prompt, mask], 1),
        response_mask=torch.cat([torch.zeros_like(prompt), mask], 1), prompt_length=3, group_size=1,
        lengths=mask.sum(-1), truncated=torch.tensor([False]), images={},
    )  # fmt: skip
