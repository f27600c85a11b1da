"""Which NoteVLM parameters train: stage freezing and the PEFT LoRA preset.

Stages (LLaVA's two-stage recipe, Liu et al., 2023): ``align`` trains the fusion module only (vision
tower and LM frozen); ``sft`` trains fusion + LM (vision tower frozen). LoRA (Hu et al., 2021) SFT:
adapters on the LM's linear layers only, the fusion module trained and saved whole
(``modules_to_save``), the vision tower frozen.

PEFT matches ``target_modules`` lists and ``modules_to_save`` by name *suffix*, so a bare ``"proj"``
would also hit ``q_proj`` and a bare ``"q_proj"`` could hit a vision block. The preset therefore uses a
regex anchored at ``language_model.`` and checks that ``"fusion"`` names exactly one module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch import nn

from mm.errors import UserError

STAGES = ("align", "sft")
FUSION_MODULE = "fusion"
INDEX_MODULE = "image_index"
"""NoteVLM's optional image index embeddings (``image_index_embeddings``): train and save with the fusion."""
POSITION_MODULE = "token_position"
"""NoteVLM's optional token position embeddings (``token_position_embeddings``): likewise."""
TAG_MODULES = (INDEX_MODULE, POSITION_MODULE)
"""The embeddings added to the fusion's tokens, which go with the fusion."""
LM_MODULE = "language_model"
VISION_MODULE = "vision_tower"


@dataclass(kw_only=True)
class LoraPreset:
    """LoRA settings for SFT of NoteVLM's language model."""

    r: int = 8
    """LoRA rank."""
    alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA input."""
    save_fusion: bool = True
    """Train the fusion module fully and save it with the adapter (`modules_to_save`)."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"LoraPreset.r must be >= 1, got {self.r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraPreset.dropout must be in [0, 1), got {self.dropout}")


def _check_model(model: nn.Module) -> None:
    for name in (VISION_MODULE, FUSION_MODULE, LM_MODULE):
        if not isinstance(getattr(model, name, None), nn.Module):
            raise TypeError(
                f"expected a NoteVLMForConditionalGeneration (with .{name}), got {type(model).__name__}; "
                "for a PeftModel call .get_base_model() first"
            )


def _qualified_name(model: nn.Module, module: nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is module)


def lm_linear_names(model: nn.Module) -> list[str]:
    """Leaf names of the LM decoder's ``nn.Linear`` layers (the output head is outside the decoder)."""
    _check_model(model)
    lm = getattr(model, LM_MODULE)
    head = model.get_output_embeddings()
    names = {
        n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, nn.Linear) and m is not head
    }
    if not names:
        raise ValueError("the language model has no nn.Linear layers to put LoRA on")
    return sorted(names)


def lm_target_regex(model: nn.Module) -> str:
    """A PEFT ``target_modules`` regex (full match) hitting the LM decoder's linear layers, nothing else."""
    alternatives = "|".join(re.escape(n) for n in lm_linear_names(model))
    prefix = re.escape(_qualified_name(model, getattr(model, LM_MODULE)))
    return rf"{prefix}\..*\.({alternatives})"


def lora_config(model: nn.Module, preset: LoraPreset | None = None) -> Any:
    """The `peft.LoraConfig` of the preset for ``model`` (checked: fusion name unique, no vision hits)."""
    from peft import LoraConfig  # function-level: importing peft takes seconds; only LoRA needs it

    preset = preset or LoraPreset()
    regex = lm_target_regex(model)
    names = [n for n, _ in model.named_modules()]
    hits = [n for n in names if re.fullmatch(regex, n)]
    lm_prefix = _qualified_name(model, getattr(model, LM_MODULE)) + "."
    stray = [n for n in hits if not n.startswith(lm_prefix)]
    if stray or not hits:
        raise ValueError(
            f"LoRA target regex {regex!r} matched outside the LM or nothing: {stray[:3] or hits}"
        )
    modules_to_save = None
    if preset.save_fusion:
        suffix_hits = [n for n in names if n.endswith(FUSION_MODULE)]
        if len(suffix_hits) != 1:
            raise ValueError(
                f"modules_to_save={FUSION_MODULE!r} would match {suffix_hits} (PEFT matches by suffix); "
                "rename the clashing modules"
            )
        modules_to_save = [FUSION_MODULE]
        modules_to_save += [m for m in TAG_MODULES if getattr(model, m, None) is not None]
    return LoraConfig(
        r=preset.r,
        lora_alpha=preset.alpha,
        lora_dropout=preset.dropout,
        target_modules=regex,
        modules_to_save=modules_to_save,
        bias="none",
    )


def apply_lora(
    model: nn.Module, preset: LoraPreset | None = None, *, gradient_checkpointing: bool = False
) -> Any:
    """Wrap ``model`` in a `peft.PeftModel` with the preset; vision tower frozen (0 trainable parameters).

    With ``gradient_checkpointing`` the LM checkpoints its blocks and the input embeddings are made to
    require grad (`enable_input_require_grads`), so reentrant checkpointing never sees inputs without
    grad ("element 0 of tensors does not require grad").
    """
    from peft import get_peft_model  # function-level: importing peft takes seconds

    _check_model(model)
    cfg = lora_config(model, preset)
    if gradient_checkpointing:
        enable_checkpointing(model)
    for p in getattr(model, VISION_MODULE).parameters():
        p.requires_grad_(False)
    return get_peft_model(model, cfg)


def enable_checkpointing(model: nn.Module, *, use_reentrant: bool = True) -> None:
    """Activation checkpointing of the LM blocks, safe with frozen embeddings (`enable_input_require_grads`).

    ``use_reentrant=True`` is the strict case: it fails unless some checkpointed input requires grad.
    """
    kwargs = {"use_reentrant": use_reentrant}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.enable_input_require_grads()


def freeze_for_stage(model: nn.Module, stage: str) -> dict[str, int]:
    """Set ``requires_grad`` for a full-parameter stage and return trainable counts per part.

    ``align``: fusion trains, vision tower + LM frozen. ``sft``: fusion + LM train, vision frozen.
    """
    if stage not in STAGES:
        raise UserError(f"unknown stage {stage!r}; known stages: {', '.join(STAGES)}")
    _check_model(model)
    trains = {VISION_MODULE: False, FUSION_MODULE: True, LM_MODULE: stage == "sft"}
    for part, flag in trains.items():
        for p in getattr(model, part).parameters():
            p.requires_grad_(flag)
    for p in model.get_output_embeddings().parameters():  # the LM head goes with the LM
        p.requires_grad_(stage == "sft")
    for tag in TAG_MODULES:  # index / position embeddings of the fusion tokens go with the fusion
        if getattr(model, tag, None) is not None:
            getattr(model, tag).weight.requires_grad_(True)
    return trainable_counts(model)


def trainable_counts(model: nn.Module) -> dict[str, int]:
    """Trainable parameters of ``model`` (a NoteVLM or a PeftModel of one) by part, plus ``total``.

    ``language_model`` includes the output head (``lm_head``).
    """
    counts = {VISION_MODULE: 0, FUSION_MODULE: 0, LM_MODULE: 0, "other": 0}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        parts = name.split(".")
        part = next((x for x in (VISION_MODULE, FUSION_MODULE, LM_MODULE) if x in parts), "other")
        part = FUSION_MODULE if any(tag in parts for tag in TAG_MODULES) else part
        part = LM_MODULE if "lm_head" in parts else part
        counts[part] += p.numel()
    counts["total"] = sum(counts.values())
    return counts
