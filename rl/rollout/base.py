"""The rollout engine interface and the name -> engine registry."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mm.errors import UserError

ENGINES: dict[str, str] = {
    "local": "rl.rollout.local:LocalEngine",
    "vllm": "rl.rollout.vllm:VLLMEngine",
}
"""Engine name -> ``module:class`` (imported only when chosen: vLLM is an optional extra)."""


@dataclass(frozen=True, kw_only=True)
class SamplingSpec:
    """How completions are sampled."""

    group_size: int
    """G: completions per prompt."""
    max_new_tokens: int
    """Longest completion (tokens); longer ones are cut."""
    temperature: float = 1.0
    """Softmax temperature (the trainer scores with the same)."""
    top_p: float = 1.0
    """Nucleus mass (1 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""

    def __post_init__(self) -> None:
        if self.group_size < 1 or self.max_new_tokens < 1 or self.temperature <= 0:
            raise ValueError(
                f"need group_size >= 1, max_new_tokens >= 1, temperature > 0; got {self.group_size}, "
                f"{self.max_new_tokens}, {self.temperature}"
            )
        if not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"need 0 < top_p <= 1 and top_k >= 0; got {self.top_p}, {self.top_k}")

    @property
    def full_support(self) -> bool:
        """No top-k / top-p truncation: the sampling distribution is softmax(logits / T)."""
        return self.top_p == 1.0 and self.top_k == 0


@dataclass(kw_only=True)
class Completions:
    """``B*G`` sampled completions, prompt-major (rows ``g*G .. g*G+G-1`` answer prompt ``g``)."""

    token_ids: list[list[int]]
    """Raw new ids per row, up to and including the first eos (never decoded and re-encoded)."""
    truncated: list[bool]
    """Per row: no eos within ``max_new_tokens``."""
    logps: list[list[float]] | None
    """Per row, per token: log-prob under the distribution the token was drawn from; None when that is
    the trainer's distribution (no importance correction needed)."""

    def __post_init__(self) -> None:
        if len(self.truncated) != len(self.token_ids):
            raise ValueError(f"{len(self.token_ids)} completions but {len(self.truncated)} truncated flags")
        if self.logps is not None and [len(x) for x in self.logps] != [len(x) for x in self.token_ids]:
            raise ValueError("Completions.logps must hold one log-prob per completion token")


class RolloutEngine(ABC):
    """Samples completions for :class:`mm.model.adapter.Sample` prompts with the adapter's current weights."""

    name: str = "?"

    def __init__(self, adapter: Any, spec: SamplingSpec) -> None:
        self.adapter = adapter
        self.spec = spec

    @abstractmethod
    def generate(self, samples: Sequence[Any], *, seeds: Sequence[int] | None = None) -> Completions:
        """``spec.group_size`` completions for each of ``samples`` (prompt-major rows).

        ``seeds`` (one per sample): each sample's completions come from a random stream of its own
        (:mod:`rl.rollout.seeded`), whatever else is in the batch, so data parallel ranks sampling their
        shards draw what one process draws for the whole batch. None: the engine's own stream."""

    def sync(self) -> None:
        """Make the engine sample from the adapter's current weights (no-op in process)."""
        return None


def build_engine(name: str, adapter: Any, spec: SamplingSpec, **options: Any) -> RolloutEngine:
    """The engine called ``name`` (:data:`ENGINES`) for ``adapter``; ``options`` go to its constructor."""
    if name not in ENGINES:
        raise UserError(f"unknown rollout engine {name!r}; expected one of {', '.join(ENGINES)}")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)(adapter, spec, **options)
