"""The teacher side of ``rl distill``: the vocabulary check, answer-window logits of any adapter, and
teacher log-probs over the vocabulary computed once per rollout (no gradient, in row batches, cached).

Student and teacher may tokenise prompts differently (another image size, another number of image
tokens), but their answers are the same token ids: in an ``answer_batch`` every row's answer starts at
the first answer column ``P`` (prompts left padded, answers right padded), so the answer windows
``[P, T)`` of the two batches line up token for token.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from mm.errors import UserError
from mm.model.adapter import Sample
from mm.model.adapter.base import NOT_MODEL_INPUTS
from mm.model.adapter.batching import first_response_column


def window_logits(
    adapter: Any, batch: dict[str, Any], model: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits over the answer window of an ``adapter.answer_batch`` batch: ``(B, W, V)`` where
    ``W = T - start`` and ``logits[:, w]`` predicts ``input_ids[:, start + w]``, and the mask ``(B, W)``.

    The forward of :meth:`VLMAdapter.token_logps` (positions from ``adapter.position_ids``, logits kept
    from the first answer column on) under ``model`` (default the adapter's)."""
    ids, resp = batch["input_ids"], batch["response_mask"]  # (B, T)
    start = first_response_column(resp)
    keep = ids.shape[1] - start + 1
    inputs = {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS}
    positions = adapter.position_ids(batch)
    if positions is not None:
        inputs["position_ids"] = positions
    out = (model or adapter.model)(**inputs, use_cache=False, logits_to_keep=keep)
    return out.logits[:, -keep:-1], resp[:, start:]  # (B, W, V), (B, W)


def output_width(adapter: Any) -> int:
    """Number of logits the adapter's model outputs per position (its LM head's rows)."""
    head = adapter.base_model.get_output_embeddings()
    if head is None:
        raise UserError(f"{adapter.family}: the model has no output embeddings (LM head) to distil through")
    return int(head.weight.shape[0])


def check_same_vocab(student: Any, teacher: Any) -> None:
    """Refuse a student and teacher that do not share one tokenizer and one logit layout."""
    sv, tv = student.tokenizer.get_vocab(), teacher.tokenizer.get_vocab()
    if sv != tv:
        only_s = sorted(set(sv) - set(tv))[:3]
        moved = sorted(k for k in set(sv) & set(tv) if sv[k] != tv[k])[:3]
        raise UserError(
            f"student and teacher vocabularies differ ({len(sv)} vs {len(tv)} tokens; only in the student: "
            f"{only_s}, other ids: {moved}): token-level distillation needs one shared tokenizer; pick a "
            "teacher of the student's family and tokenizer"
        )
    ws, wt = output_width(student), output_width(teacher)
    if ws != wt:
        raise UserError(
            f"student and teacher output {ws} and {wt} logits per token (their LM heads differ in size): "
            "token-level distillation needs the same vocabulary size; resize one model's embeddings"
        )
    if student.eos_token_ids != teacher.eos_token_ids:
        raise UserError(f"student and teacher end answers with different eos ids ({student.eos_token_ids} vs "
                        f"{teacher.eos_token_ids}); align their generation configs")  # fmt: skip


class TeacherScorer:
    """Teacher log-probs ``(B, W, V)`` (float32, temperature 1) of a rollout's answers, computed under
    ``no_grad`` in batches of ``batch_size`` rows and cached for the last rollout key.

    Any temperature ``T`` follows exactly: ``log_softmax(logps / T) == log_softmax(logits / T)``."""

    def __init__(self, adapter: Any, *, batch_size: int) -> None:
        self.adapter, self.batch_size = adapter, batch_size
        self._key: Hashable | None = None
        self._value: torch.Tensor | None = None
        self.forwards = 0
        """Teacher forwards run so far (one per row batch; a cache hit runs none)."""

    @torch.no_grad()
    def logps(
        self, key: Hashable, samples: Sequence[Sample], answers: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Log-probs ``(B, A, V)`` of the teacher at each answer position (A = longest answer; 0 past a
        row's end); recomputed only when ``key`` changes."""
        if key == self._key and self._value is not None:
            return self._value
        width = max(len(a) for a in answers)
        parts = []
        was = self.adapter.model.training
        self.adapter.model.eval()
        try:
            for i in range(0, len(samples), self.batch_size):
                rows = slice(i, i + self.batch_size)
                batch = self.adapter.answer_batch(samples[rows], answers[rows])
                logits, mask = window_logits(self.adapter, batch)  # (b, w, V), (b, w)
                lp = torch.log_softmax(logits.float(), dim=-1).masked_fill(mask[..., None] == 0, 0.0)
                parts.append(torch.nn.functional.pad(lp, (0, 0, 0, width - lp.shape[1])))  # (b, A, V)
                self.forwards += 1
        finally:
            self.adapter.model.train(was)
        self._key, self._value = key, torch.cat(parts)
        return self._value
