"""Per-family facts the adapters need, as data: where the LM decoder lives, its LoRA targets, M-RoPE.

    spec = family_spec(model)    # FAMILIES[model.config.model_type], checked against the model
    spec.language_model          # "model.language_model" (LLaVA, Qwen2-VL); "model.text_model" (Idefics3)

A model type not listed gets a spec derived from the model itself (`get_decoder()`, its linear layers,
`get_rope_index` => M-RoPE), so new families work without an entry; an entry pins tested defaults.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from mm.errors import UserError

LM_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Attention and MLP projections of Llama/Qwen2/Mistral-style decoders."""


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    """What differs between VLM families for the adapter."""

    language_model: str
    """Qualified name of the LM decoder module (LoRA goes inside it only, never the vision tower)."""
    lora_targets: tuple[str, ...] = LM_PROJECTIONS
    """Default LoRA target leaf names inside the LM decoder."""
    mrope: bool = False
    """The model builds its own (3-D, M-RoPE) positions from the attention mask and image grids."""


FAMILIES: dict[str, FamilySpec] = {
    "llava": FamilySpec(language_model="model.language_model"),
    "llava_next": FamilySpec(language_model="model.language_model"),
    "qwen2_vl": FamilySpec(language_model="model.language_model", mrope=True),
    "qwen2_5_vl": FamilySpec(language_model="model.language_model", mrope=True),
    "qwen3_vl": FamilySpec(language_model="model.language_model", mrope=True),
    "gemma3": FamilySpec(language_model="model.language_model"),
    "internvl": FamilySpec(language_model="model.language_model"),
    "idefics3": FamilySpec(language_model="model.text_model"),
    "smolvlm": FamilySpec(language_model="model.text_model"),
    "notevlm": FamilySpec(language_model="model.language_model"),
}
"""model_type -> spec. Tested with tiny instances of each (tests/mm/adapter_helpers.py)."""


def _qualified_name(model: nn.Module, module: nn.Module) -> str | None:
    return next((n for n, m in model.named_modules() if m is module), None)


def _linear_leaves(module: nn.Module) -> tuple[str, ...]:
    names = {n.rsplit(".", 1)[-1] for n, m in module.named_modules() if isinstance(m, nn.Linear)}
    return tuple(sorted(names))


def family_spec(model: Any) -> FamilySpec:
    """The spec of ``model`` (a transformers VLM, not a PeftModel): registry entry or derived."""
    names = dict(model.named_modules())
    spec = FAMILIES.get(model.config.model_type)
    if spec is not None and spec.language_model in names:
        return spec
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    where = _qualified_name(model, decoder) if isinstance(decoder, nn.Module) else None
    if not where:
        raise UserError(
            f"cannot find the language model inside {type(model).__name__} (model_type "
            f"{model.config.model_type!r}): add a FamilySpec to mm.model.adapter.family.FAMILIES"
        )
    inner = getattr(model, "model", None)
    return FamilySpec(
        language_model=where,
        lora_targets=spec.lora_targets if spec else _linear_leaves(decoder),
        mrope=spec.mrope if spec else hasattr(inner, "get_rope_index"),
    )


def lm_target_regex(model: Any, spec: FamilySpec, leaves: Sequence[str] | None = None) -> str:
    """A PEFT ``target_modules`` regex (full match) for ``leaves`` inside the LM decoder only, checked."""
    leaves = tuple(leaves) if leaves is not None else spec.lora_targets
    if not leaves:
        raise ValueError("LoRA target_modules is empty; pass leaf names like ['q_proj', 'v_proj'] or None")
    alternatives = "|".join(re.escape(n) for n in leaves)
    regex = rf"{re.escape(spec.language_model)}\..*\.({alternatives})"
    hits = [n for n, m in model.named_modules() if re.fullmatch(regex, n)]
    if not hits:
        raise UserError(
            f"LoRA targets {list(leaves)} match no module inside {spec.language_model}; its linear "
            f"layers are {list(_linear_leaves(model.get_submodule(spec.language_model)))}"
        )
    return regex
