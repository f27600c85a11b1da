"""NoteVLM: config, model and processor, registered with the transformers Auto classes.

Importing this package registers model type ``notevlm`` so that, offline,

    import mm.model
    model = AutoModelForImageTextToText.from_pretrained(run_dir)   # or AutoModelForCausalLM
    processor = NoteProcessor.from_pretrained(run_dir)
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from mm.model.configuration import NoteVLMConfig
from mm.model.modeling import NoteVLMForConditionalGeneration, NoteVLMModel, NoteVLMPreTrainedModel
from mm.model.processing import IGNORE_INDEX, NoteProcessor

AutoConfig.register(NoteVLMConfig.model_type, NoteVLMConfig, exist_ok=True)
AutoModelForImageTextToText.register(NoteVLMConfig, NoteVLMForConditionalGeneration, exist_ok=True)
AutoModelForCausalLM.register(NoteVLMConfig, NoteVLMForConditionalGeneration, exist_ok=True)

__all__ = [
    "IGNORE_INDEX",
    "NoteProcessor",
    "NoteVLMConfig",
    "NoteVLMForConditionalGeneration",
    "NoteVLMModel",
    "NoteVLMPreTrainedModel",
]
