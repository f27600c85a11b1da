"""Where :func:`rl.trainers.dpo.dpo_step` gets its per-token log-probs: a scorer of policy and reference.

- :class:`AdapterScorer`: through :class:`mm.model.adapter.VLMAdapter` (``token_logps`` on batches in
  the adapter's layout, e.g. ``answer_batch``), so every family the adapter loads trains the same way;
  ``rl dpo`` uses it for NoteVLM and for transformers VLMs.
- :class:`ModelScorer`: :func:`rl.trainers.common.batch_token_logps` on a bare model (a text-only
  causal LM in ``benchmarks/rl_bench.py``).

Both return ``(logps, mask, entropy)`` with one row per batch row and a last axis over (a window of)
the columns; only sums over that axis and masked means reach the loss, so the two layouts give the same
numbers. The adapter's ``token_logps`` does not return logits; the entropy metric reads them from the
model's output with a forward hook (:func:`capture_logits`), so no second forward pass is run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from mm.model.adapter.batching import first_response_column
from rl.kl import entropy_from_logits
from rl.trainers.common import Reference, batch_token_logps

NOT_MODEL_KEYS = ("num_pairs",)
"""Batch entries that describe the batch (never passed to the model)."""


class Scorer(Protocol):
    """Per-token log-probs of a batch's response tokens under the policy and the reference."""

    def policy(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logps, mask, entropy)``, each (R, W); logps with grad, entropy detached."""
        ...

    def reference(self, batch: dict[str, Any]) -> torch.Tensor:
        """Reference log-probs (R, W), no grad, in the same layout as :meth:`policy`."""
        ...


class ModelScorer:
    """A bare model (NoteVLM batches or a text-only causal LM) and its :class:`Reference`."""

    def __init__(self, model: Any, ref: Reference) -> None:
        self.model, self.ref = model, ref

    def policy(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logps, mask, entropy = batch_token_logps(self.model, batch, with_entropy=True)  # (R, W) each
        return logps, mask, entropy

    def reference(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.ref.token_logps(batch)


@contextlib.contextmanager
def capture_logits(model: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Within the block, ``box["logits"]`` holds the logits of the model's last forward call."""
    box: dict[str, torch.Tensor] = {}

    def hook(_module: Any, _args: Any, output: Any) -> None:
        box["logits"] = output.logits

    handle = model.register_forward_hook(hook)
    try:
        yield box
    finally:
        handle.remove()


class AdapterScorer:
    """Policy and reference through a :class:`mm.model.adapter.VLMAdapter`.

    ``ref``: a :class:`Reference` over ``adapter.model``; kind ``adapter`` (LoRA off) scores with the same
    adapter inside ``disable_adapter()``; kind ``copy`` wraps the frozen copy in an adapter of the same
    class and processor.
    """

    def __init__(self, adapter: Any, ref: Reference) -> None:
        if ref.policy is not adapter.model:
            raise ValueError("the Reference must be built over adapter.model")
        self.adapter, self.ref = adapter, ref
        self.ref_adapter = adapter
        if ref.kind == "copy":
            self.ref_adapter = type(adapter)(model=ref.copy, processor=adapter.processor)

    @staticmethod
    def _inputs(batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in batch.items() if k not in NOT_MODEL_KEYS}

    def policy(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs = self._inputs(batch)
        with capture_logits(self.adapter.model) as box:
            logps, mask = self.adapter.token_logps(inputs)  # (R, T) each
        start = first_response_column(mask)
        logits = box["logits"].detach()[:, -(mask.shape[1] - start) - 1 : -1]  # (R, T - start, V)
        entropy = torch.zeros(logps.shape, dtype=torch.float32, device=logps.device)  # (R, T)
        with torch.no_grad():
            entropy[:, start:] = entropy_from_logits(logits).float()
        return logps, mask, entropy

    def reference(self, batch: dict[str, Any]) -> torch.Tensor:
        with torch.no_grad(), self.ref.model():
            return self.ref_adapter.token_logps(self._inputs(batch))[0]  # (R, T)
