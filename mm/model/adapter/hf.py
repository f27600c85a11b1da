"""`TransformersAdapter`: any `AutoModelForImageTextToText` + `AutoProcessor` (LLaVA, Qwen2-VL, Idefics3 ...).

Prompts come from the processor's chat template: the user turn is ``[image] * n + [text]`` content
parts, so each family places its image markers in its own format (LLaVA ``<image>\\n``, Qwen2-VL
``<|vision_start|><|image_pad|><|vision_end|>``, Idefics3 ``<image>`` expanded to tiles), and the
processor expands them to the right number of image tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from mm.model.adapter.base import Sample, VLMAdapter
from mm.model.adapter.family import FamilySpec, family_spec, lm_target_regex


class TransformersAdapter(VLMAdapter):
    """A transformers VLM and its processor; family quirks come from :mod:`mm.model.adapter.family`."""

    def __init__(self, *, model: Any, processor: Any) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.family = base.config.model_type
        super().__init__(model=model, processor=processor)
        if not getattr(processor, "chat_template", None):
            raise UserError(
                f"the {type(processor).__name__} has no chat template; set processor.chat_template to the "
                "family's template (as shipped with the hub checkpoint) and save it with the model"
            )
        self.spec: FamilySpec = family_spec(self.base_model)

    @classmethod
    def from_folder(
        cls, folder: str | Path, *, device: Any = "cpu", dtype: Any = None
    ) -> TransformersAdapter:
        """Load a local folder with `AutoModelForImageTextToText` + `AutoProcessor` (never the hub)."""
        from transformers import AutoModelForImageTextToText, AutoProcessor

        model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=dtype, local_files_only=True)
        processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
        return cls(model=model.to(device).eval(), processor=processor)

    def chat_text(self, sample: Sample) -> str:
        """The chat-template text of one user turn + generation prompt (image markers not expanded)."""
        content = [{"type": "image"} for _ in sample.images] + [{"type": "text", "text": sample.text}]
        return self.processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )

    def build_prompts(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """See :meth:`VLMAdapter.build_prompts`; images of sample b are ``samples[b].images``, in order."""
        samples = list(samples)
        if not samples:
            raise ValueError("build_prompts needs at least one sample")
        tok = self.tokenizer
        side = tok.padding_side
        tok.padding_side = "left"
        try:
            batch = self.processor(
                text=[self.chat_text(s) for s in samples],
                images=[list(s.images) for s in samples],
                return_tensors="pt",
                padding=True,
            )
        finally:
            tok.padding_side = side
        return self.to_device(dict(batch))

    def position_ids(self, batch: dict[str, Any]) -> torch.Tensor | None:
        """M-RoPE families (Qwen2-VL) compute 3-D positions from the mask and image grids themselves."""
        return None if self.spec.mrope else super().position_ids(batch)

    def lora_config(
        self, *, r: int, alpha: int, dropout: float, target_modules: Sequence[str] | str | None
    ) -> Any:
        from peft import LoraConfig

        if isinstance(target_modules, str):
            regex = target_modules
        else:
            regex = lm_target_regex(self.base_model, self.spec, target_modules)
        return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=regex, bias="none")
