"""The in-process engine: the trainer's own model samples the completions.

NoteVLM goes through the compact KV-cache decode loop (:func:`rl.trainers.rollout.generate_rollout`);
any other family through HF ``generate`` on the adapter's prompts (:meth:`VLMAdapter.build_prompts`, each
prompt repeated ``G`` times, as TRL), with its warpers run as custom processors so the sampling
log-probs can be recorded (:mod:`rl.rollout.recorder`). When the sampling distribution is the trainer's
(no top-k / top-p, no other generation-config processor) no log-probs are returned and the importance
weights are exactly 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mm.model.adapter.batching import trim_at_eos
from mm.train.fsdp import synced_kwargs
from rl.rollout.base import Completions, RolloutEngine, SamplingSpec
from rl.rollout.recorder import sampling_processors
from rl.rollout.seeded import SeededSampler, prompt_generators
from rl.trainers.rollout import decode_loop_supported, generate_rollout


class LocalEngine(RolloutEngine):
    """Samples with the adapter's model in this process."""

    name = "local"

    def __init__(self, adapter: Any, spec: SamplingSpec) -> None:
        super().__init__(adapter, spec)
        self.exact = spec.full_support and decode_loop_supported(adapter.base_model)
        """Sampling distribution == the trainer's: no log-probs recorded, no correction."""

    def generate(self, samples: Sequence[Any], *, seeds: Sequence[int] | None = None) -> Completions:
        samples = list(samples)
        if seeds is not None and len(seeds) != len(samples):
            raise ValueError(f"need one seed per sample: {len(samples)} samples, {len(seeds)} seeds")
        gens = None if seeds is None else prompt_generators(seeds, self.adapter.device)
        if self.adapter.family == "notevlm":
            return self._notevlm(samples, gens)
        return self._generate(samples, gens)

    def _notevlm(self, samples: list[Any], gens: list[torch.Generator] | None) -> Completions:
        a, s = self.adapter, self.spec
        prompts = a.build_prompts(samples)
        roll = generate_rollout(
            a.model, prompts, group_size=s.group_size, max_new_tokens=s.max_new_tokens, eos_id=a.eos_token_id,
            pad_id=a.pad_token_id, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
            record_logps=not self.exact, generators=gens,
        )  # fmt: skip
        ids = roll.response_ids()
        logps = None
        if roll.rollout_logps is not None:
            logps = [row[: len(t)].tolist() for row, t in zip(roll.rollout_logps, ids)]
        return Completions(token_ids=ids, truncated=roll.truncated.tolist(), logps=logps)

    def _generate(self, samples: list[Any], gens: list[torch.Generator] | None) -> Completions:
        a, s = self.adapter, self.spec
        rows = [x for x in samples for _ in range(s.group_size)]
        inputs = a.to_device(a.build_prompts(rows))
        recorder = None
        if self.exact and gens is None:
            kwargs: dict[str, Any] = dict(do_sample=True, temperature=s.temperature, top_k=0, top_p=1.0)
        else:  # the warpers as custom processors, then the recorder, then the seeded draw
            seeded = None if gens is None else SeededSampler(gens, group_size=s.group_size)
            kwargs, recorder = sampling_processors(
                a.base_model, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, sampler=seeded
            )
            recorder = None if self.exact else recorder
        model = a.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                seq = model.generate(
                    **inputs, max_new_tokens=s.max_new_tokens, pad_token_id=a.pad_token_id,
                    eos_token_id=a.eos_token_ids, **kwargs, **synced_kwargs(model),
                )  # fmt: skip  # (B*G, P + R)
        finally:
            model.train(was_training)
        new = seq[:, inputs["input_ids"].shape[1] :]  # (B*G, R)
        ids = trim_at_eos(new, a.eos_token_ids)
        eos = set(a.eos_token_ids)
        truncated = [not t or t[-1] not in eos for t in ids]
        logps = None
        if recorder is not None:
            table = recorder.finish(new)  # (B*G, R)
            logps = [row[: len(t)].tolist() for row, t in zip(table, ids)]
        return Completions(token_ids=ids, truncated=truncated, logps=logps)
