"""Build a NoteVLM and its processor from a typed YAML spec (``configs/mm/notevlm*.yaml``).

    spec = load_notevlm_spec("configs/mm/notevlm_tiny.yaml", ["fusion.kind=resampler"])
    model, processor = build_notevlm(spec)          # tokenizer: mm.data.tokenizer.load_tokenizer()

The vocabulary size and the special-token ids of the LM come from the tokenizer, the processor's image
size and K from the built vision tower and fusion spec, so the three can never disagree. ``text.pretrained``
takes the LM (config, weights, tokenizer) from a causal-LM folder (`mm.model.pretrained_lm`);
``vision.pretrained`` the tower and its input size / normalisation (`mm.vision.resolve_pretrained`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mm.config import from_dict, load_config, to_dict
from mm.data.tokenizer import load_tokenizer
from mm.fusion import FusionConfig
from mm.model import pretrained_lm
from mm.model.configuration import NoteVLMConfig
from mm.model.modeling import NoteVLMForConditionalGeneration
from mm.model.processing import NoteProcessor
from mm.vision import VisionConfig, normalisation

TEXT_FAMILIES = ("qwen2", "llama")


@dataclass(kw_only=True)
class TextSpec:
    """The causal LM: a random-init transformers Qwen2 or Llama (vocabulary from the tokenizer), or a
    pretrained causal-LM folder (``pretrained``)."""

    family: str = "qwen2"
    """transformers model type: "qwen2" or "llama"."""
    hidden_size: int = 128
    """Model width D_lm (the fusion's output width)."""
    intermediate_size: int = 256
    """MLP hidden size."""
    layers: int = 2
    """Decoder blocks."""
    heads: int = 4
    """Attention heads; hidden_size must divide by heads."""
    kv_heads: int = 2
    """Key/value heads (grouped-query attention); heads must divide by kv_heads."""
    max_position_embeddings: int = 1024
    """Longest sequence the rotary positions are set up for."""
    tie_word_embeddings: bool = False
    """Share the input embedding and the output head."""
    pretrained: str | None = None
    """A local AutoModelForCausalLM folder: its config, weights, tokenizer and chat template are used and the
    fields above must stay at their defaults. None = random init from the fields above."""

    def __post_init__(self) -> None:
        if self.pretrained is not None:
            changed = [
                f.name for f in fields(self) if f.name != "pretrained" and getattr(self, f.name) != f.default
            ]
            if changed:
                raise ValueError(
                    f"text.pretrained={self.pretrained} fixes the LM's architecture; drop text.{changed}"
                )
            return
        if self.family not in TEXT_FAMILIES:
            raise ValueError(f"text.family {self.family!r} unknown; known: {', '.join(TEXT_FAMILIES)}")
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"text: hidden_size ({self.hidden_size}) must divide by heads ({self.heads}) and heads by "
                f"kv_heads ({self.kv_heads})"
            )


@dataclass(kw_only=True)
class NoteVLMSpec:
    """Everything needed to build a NoteVLM and its NoteProcessor."""

    vision: VisionConfig = field(default_factory=VisionConfig)
    """Vision tower (mm.vision.VisionConfig)."""
    fusion: FusionConfig = field(default_factory=FusionConfig)
    """Fusion kind, budget K and size (mm.fusion.FusionConfig)."""
    text: TextSpec = field(default_factory=TextSpec)
    """The causal LM."""
    max_images: int = 4
    """Most images per note."""
    max_length: int = 256
    """Longest token sequence the processor emits (image tokens are never truncated)."""
    image_mean: tuple[float, float, float] | None = None
    """Per-channel mean subtracted from [0, 1] pixels; None = the vision tower's (its pretrained source's,
    else 0.5)."""
    image_std: tuple[float, float, float] | None = None
    """Per-channel std dividing [0, 1] pixels; None = the vision tower's (as image_mean)."""
    tokenizer: str | None = None
    """Tokenizer folder; None = the project's shipped tokenizer (mm.data.tokenizer.load_tokenizer), or
    text.pretrained's."""
    image_index_embeddings: bool = False
    """A learned embedding of each image slot added to that image's fusion tokens (NoteVLMConfig)."""
    token_position_embeddings: bool = False
    """A learned embedding of each token place added to every image's K fusion tokens (NoteVLMConfig)."""

    def __post_init__(self) -> None:
        if self.text.pretrained is not None and self.tokenizer is not None:
            raise ValueError("text.pretrained brings its own tokenizer; drop tokenizer or text.pretrained")
        if self.max_images < 1:
            raise ValueError(f"max_images must be >= 1, got {self.max_images}")
        need = self.max_images * (self.fusion.budget + 2)
        if self.max_length <= need:
            raise ValueError(
                f"max_length={self.max_length} cannot hold {self.max_images} images x "
                f"(K={self.fusion.budget} + 2 separators) = {need} tokens plus text; raise max_length or "
                "lower fusion.budget"
            )


def load_notevlm_spec(path: str | Path | None = None, overrides: list[str] | None = None) -> NoteVLMSpec:
    """The spec from a YAML file plus ``key.sub=value`` overrides (unknown keys are errors)."""
    return load_config(NoteVLMSpec, path, overrides)


def notevlm_config(spec: NoteVLMSpec, tokenizer: Any) -> Any:
    """The :class:`NoteVLMConfig` of ``spec`` with vocabulary and special ids taken from ``tokenizer``."""
    t = spec.text
    if t.pretrained is not None:
        text_config = pretrained_lm.lm_text_config(t.pretrained, tokenizer)
    else:
        text_config = {
            "model_type": t.family,
            "vocab_size": len(tokenizer),
            "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size,
            "num_hidden_layers": t.layers,
            "num_attention_heads": t.heads,
            "num_key_value_heads": t.kv_heads,
            "max_position_embeddings": t.max_position_embeddings,
            "tie_word_embeddings": t.tie_word_embeddings,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        }
    return NoteVLMConfig(
        vision_config=to_dict(spec.vision),
        fusion_kind=spec.fusion.kind,
        fusion_budget=spec.fusion.budget,
        fusion_kwargs=spec.fusion.kind_kwargs(),
        text_config=text_config,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        max_images=spec.max_images,
        image_index_embeddings=spec.image_index_embeddings,
        token_position_embeddings=spec.token_position_embeddings,
        tie_word_embeddings=bool(text_config.get("tie_word_embeddings", False)),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def build_processor(
    spec: NoteVLMSpec, tokenizer: Any, image_size: int, vision: VisionConfig | None = None
) -> Any:
    """The :class:`NoteProcessor` matching ``spec`` for a tower taking ``image_size`` square images;
    ``vision`` is the resolved tower config (normalisation and resize mode; default ``spec.vision``)."""
    vision = vision if vision is not None else spec.vision
    mean, std = normalisation(vision)
    return NoteProcessor(
        tokenizer=tokenizer,
        image_size=image_size,
        tokens_per_image=spec.fusion.budget,
        max_length=spec.max_length,
        max_images=spec.max_images,
        image_mean=spec.image_mean if spec.image_mean is not None else mean,
        image_std=spec.image_std if spec.image_std is not None else std,
        resize=vision.resize,
        budget_per=spec.fusion.budget_per,
    )


def build_notevlm(spec: NoteVLMSpec, tokenizer: Any | None = None) -> tuple[Any, Any]:
    """A NoteVLM (LM and vision tower pretrained if the spec says so, the rest random) and its processor."""
    if tokenizer is None:
        if spec.text.pretrained is not None:
            tokenizer = pretrained_lm.load_lm_tokenizer(spec.text.pretrained)
        else:
            tokenizer = load_tokenizer(spec.tokenizer)
    config = notevlm_config(spec, tokenizer)
    model = NoteVLMForConditionalGeneration(config)
    if spec.text.pretrained is not None:
        pretrained_lm.copy_lm_weights(model, spec.text.pretrained)
    h, w = model.vision_tower.image_size
    if h != w:
        raise ValueError(f"NoteProcessor makes square images; the vision tower takes {h}x{w}")
    vision = from_dict(VisionConfig, dict(config.vision_config), "vision_config")
    return model, build_processor(spec, tokenizer, int(h), vision)
