"""The vLLM engine (``rollout.engine: vllm``; ``pip install 'notelens[vllm]'``, a CUDA GPU).

vLLM loads the same model folder, renders the same chat-template prompt as the adapter (images as
``multi_modal_data``, expanded by vLLM's own processor) and samples ``n = G`` completions per prompt with
``SamplingParams(logprobs=0)``: the log-prob of each sampled token under the distribution it was drawn
from (``logprobs_mode="processed_logprobs"``: after temperature, top-k, top-p, as TRL). Its kernels differ
from the trainer's, so those log-probs never equal the trainer's and the truncated importance correction
(:mod:`rl.importance`) always applies. :meth:`VLLMEngine.sync` copies the trainer's weights into vLLM after
each optimizer step (LoRA merged on the fly, as TRL's colocate mode).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from mm.errors import UserError
from rl.rollout.base import Completions, RolloutEngine, SamplingSpec

INSTALL_HINT = "pip install 'notelens[vllm]' on a machine with a CUDA GPU, or use rollout.engine=local"


def import_vllm() -> Any:
    """The ``vllm`` module, or a one-line :class:`UserError` saying how to get it."""
    try:
        import vllm
    except ImportError as e:
        raise UserError(f"rollout.engine=vllm needs vLLM, not installed ({e}); {INSTALL_HINT}") from None
    if not torch.cuda.is_available():
        raise UserError(f"rollout.engine=vllm needs a CUDA GPU and none is visible; {INSTALL_HINT}")
    return vllm


class VLLMEngine(RolloutEngine):
    """vLLM's ``LLM`` in this process, on the model folder the adapter was loaded from."""

    name = "vllm"

    def __init__(
        self,
        adapter: Any,
        spec: SamplingSpec,
        *,
        model_dir: str,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(adapter, spec)
        if adapter.family == "notevlm":
            raise UserError("rollout.engine=vllm does not know NoteVLM; use rollout.engine=local for it")
        vllm = import_vllm()
        self.vllm = vllm
        dtype = str(adapter.dtype).removeprefix("torch.")
        # the worker runs in this process (as TRL's colocate mode), so sync() can reach its model
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                           ("MASTER_ADDR", "localhost"), ("MASTER_PORT", "29531")):  # fmt: skip
            os.environ.setdefault(key, value)
        self.llm = vllm.LLM(
            model=str(model_dir), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, seed=seed, logprobs_mode="processed_logprobs",
            distributed_executor_backend="external_launcher",
        )  # fmt: skip

    def params(self, seed: int | None = None) -> Any:
        """``SamplingParams`` of :attr:`spec`: ``n = G``, ``logprobs=0`` (the sampled token's log-prob);
        ``seed``: the request's own random stream (vLLM's per-request seed)."""
        s = self.spec
        return self.vllm.SamplingParams(
            n=s.group_size, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k if s.top_k else -1,
            max_tokens=s.max_new_tokens, logprobs=0, stop_token_ids=list(self.adapter.eos_token_ids),
            seed=seed,
        )  # fmt: skip

    def inputs(self, samples: Sequence[Any]) -> list[dict[str, Any]]:
        """One vLLM prompt per sample: the chat-template text and its PIL images."""
        return [
            {"prompt": self.adapter.chat_text(x), "multi_modal_data": {"image": list(x.images)}}
            for x in samples
        ]

    def generate(self, samples: Sequence[Any], *, seeds: Sequence[int] | None = None) -> Completions:
        params = self.params() if seeds is None else [self.params(s % 2**31) for s in seeds]
        outputs = self.llm.generate(self.inputs(samples), sampling_params=params, use_tqdm=False)
        eos = set(self.adapter.eos_token_ids)
        ids, logps, truncated = [], [], []
        for out in outputs:
            for c in out.outputs:  # G per prompt, in order
                toks = [int(t) for t in c.token_ids]
                ids.append(toks)
                logps.append([float(step[t].logprob) for step, t in zip(c.logprobs, toks)])
                truncated.append(not toks or toks[-1] not in eos)
        return Completions(token_ids=ids, truncated=truncated, logps=logps)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The trainer's weights under their transformers names (LoRA merged into the base layers)."""
        model = self.adapter.model
        if not hasattr(model, "peft_config"):
            yield from model.state_dict().items()
            return
        model.merge_adapter()
        try:
            for name, value in model.state_dict().items():
                if "lora_" in name or "modules_to_save" in name:
                    continue
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                yield name, value
        finally:
            model.unmerge_adapter()

    def sync(self) -> None:
        """Load the current weights into vLLM's model and drop its prefix cache (vLLM internals, as TRL)."""
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        with torch.no_grad():
            runner.model.load_weights(self.named_weights())
        self.llm.reset_prefix_cache()
