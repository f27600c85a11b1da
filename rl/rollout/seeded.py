"""Per-prompt random streams: each prompt's ``G`` completions are drawn from a generator of its own.

A batched sampler that draws from the global RNG gives a prompt different tokens depending on which other
prompts share its batch. Under data parallelism each rank samples its shard of the step's prompts, so
1 process and N processes would draw different completions. Seeding one generator per prompt from
``(seed, step, sampling batch, position in the global batch)`` (:func:`prompt_seed`) makes every prompt's
completions a function of those numbers alone, whatever the batch or the rank (up to the float rounding of
a forward on a differently padded batch).

    seeds = [prompt_seed(cfg.train.seed, step, k, pos) for pos in positions]
    gens = prompt_generators(seeds, device)             # one torch.Generator per prompt
    nxt = draw_seeded(probs, gens, group_size=G)        # (B*G, V) -> (B*G,), rows g*G.. from gens[g]
    u = seeded_uniforms(gens, group_size=G, steps=R, device=device)   # or every draw of a decode up front

``SeededSampler`` does the same inside HF ``generate`` (families sampled with ``generate``): placed last
among the custom logits processors, it draws each row's token from its prompt's generator and returns
scores that are ``-inf`` everywhere but that token, so ``generate``'s own multinomial can only pick it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def prompt_seed(*keys: int) -> int:
    """A 63-bit seed mixed from non-negative integers (numpy ``SeedSequence``: independent streams for
    nearby keys, the same value on every platform)."""
    if any(k < 0 for k in keys):
        raise ValueError(f"prompt_seed takes non-negative integers, got {keys}")
    return int(np.random.SeedSequence(list(keys)).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def prompt_generators(seeds: Sequence[int], device: torch.device | str) -> list[torch.Generator]:
    """One ``torch.Generator`` on ``device`` per seed."""
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def draw_seeded(
    probs: torch.Tensor,
    generators: Sequence[torch.Generator],
    *,
    group_size: int,
    sampler: str = "inverse_cdf",
) -> torch.Tensor:
    """``(N, V)`` probabilities, ``N = len(generators) * group_size`` prompt-major rows -> ``(N,)`` indices.

    Rows ``g*G .. g*G+G-1`` draw from ``generators[g]``: ``inverse_cdf`` takes ``G`` uniforms (the first
    index whose cumulative probability exceeds ``u * total``, as
    :func:`rl.trainers.rollout.draw_inverse_cdf`), ``multinomial`` one ``torch.multinomial`` of the group.
    """
    N, V = probs.shape
    if N != len(generators) * group_size:
        raise ValueError(
            f"{N} rows need {N // max(group_size, 1)} generators of {group_size} rows; got {len(generators)}"
        )
    groups = probs.view(len(generators), group_size, V)  # (B, G, V)
    if sampler == "multinomial":
        draws = [torch.multinomial(p, 1, generator=g).squeeze(1) for p, g in zip(groups, generators)]
        return torch.cat(draws)  # (N,)
    if sampler != "inverse_cdf":
        raise ValueError(f"unknown sampler {sampler!r}; expected inverse_cdf or multinomial")
    u = seeded_uniforms(generators, group_size=group_size, steps=1, device=probs.device)  # (N, 1)
    return draw_with_uniforms(probs, u[:, 0])  # (N,)


def seeded_uniforms(
    generators: Sequence[torch.Generator], *, group_size: int, steps: int, device: torch.device | str
) -> torch.Tensor:
    """``(B*G, steps)`` float32 uniforms in [0, 1), rows ``g*G .. g*G+G-1`` from ``generators[g]``: a decode
    loop's every draw made up front (one call per prompt instead of one per prompt and token)."""
    return torch.cat([torch.rand(group_size, steps, generator=g, device=device) for g in generators])


def draw_with_uniforms(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``(N, V)`` probabilities and ``(N,)`` uniforms -> ``(N,)`` indices: the first index whose cumulative
    probability exceeds ``u * total`` (:func:`rl.trainers.rollout.draw_inverse_cdf` with given uniforms)."""
    cdf = probs.cumsum(dim=-1)  # (N, V)
    x = u.to(cdf.dtype)[:, None] * cdf[:, -1:]  # (N, 1)
    return torch.searchsorted(cdf, x, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)  # (N,)


class SeededSampler:
    """A logits processor that samples each row from its prompt's generator and returns one-hot scores
    (0 at the drawn token, ``-inf`` elsewhere); ``generate`` must add no warper after it (temperature 1,
    top-k 0, top-p 1: :func:`rl.rollout.recorder.sampling_processors`)."""

    def __init__(self, generators: Sequence[torch.Generator], *, group_size: int) -> None:
        self.generators, self.group_size = list(generators), group_size

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float(), dim=-1)  # (N, V)
        nxt = draw_seeded(probs, self.generators, group_size=self.group_size)  # (N,)
        out = torch.full_like(scores, -float("inf"))
        return out.scatter_(1, nxt[:, None], 0.0)  # (N, V)
