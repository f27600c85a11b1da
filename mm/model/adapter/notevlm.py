"""`NoteVLMAdapter`: NoteVLM (`mm.model`) behind the adapter interface.

Prompts are built by `NoteProcessor` (its chat template with K `<image>` placeholders per image, images
resized to the processor's size), so answer log-probs equal the RL trainers' `batch_token_logps` on
the same batch, and LoRA is the project's preset (`mm.model.peft_presets`: LM linear layers, the fusion
module trained and saved whole).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mm.model.adapter.base import Sample, VLMAdapter
from mm.model.adapter.family import FAMILIES, lm_target_regex


class NoteVLMAdapter(VLMAdapter):
    """A `NoteVLMForConditionalGeneration` (or a PeftModel of one) and its `NoteProcessor`."""

    family = "notevlm"

    @classmethod
    def from_folder(cls, folder: str | Path, *, device: Any = "cpu", dtype: Any = None) -> NoteVLMAdapter:
        """Load a NoteVLM folder written by `mm train` (config.json + weights + note_processor.json)."""
        from mm.model import NoteProcessor, NoteVLMForConditionalGeneration

        model = NoteVLMForConditionalGeneration.from_pretrained(str(folder), dtype=dtype)
        processor = NoteProcessor.from_pretrained(folder)
        return cls(model=model.to(device).eval(), processor=processor)

    def build_prompts(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """input_ids / attention_mask (B, P) left padded, pixel_values (B, N, 3, S, S), image_mask (B, N)."""
        samples = list(samples)
        if not samples:
            raise ValueError("build_prompts needs at least one sample")
        images = [list(s.images) for s in samples]
        batch = self.processor(images, [s.text for s in samples], padding_side="left")
        return self.to_device(batch)

    def lora_config(
        self, *, r: int, alpha: int, dropout: float, target_modules: Sequence[str] | str | None
    ) -> Any:
        from mm.model.peft_presets import LoraPreset, lora_config

        cfg = lora_config(self.base_model, LoraPreset(r=r, alpha=alpha, dropout=dropout))
        if isinstance(target_modules, str):
            cfg.target_modules = target_modules
        elif target_modules is not None:
            cfg.target_modules = lm_target_regex(self.base_model, FAMILIES["notevlm"], target_modules)
        return cfg
