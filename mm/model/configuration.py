"""`NoteVLMConfig`: the transformers config of NoteVLM (vision tower -> fusion -> causal LM).

Follows the composite-config convention of transformers' `LlavaConfig`: the language model's config
is a nested sub-config (`text_config`, a Qwen2 config by default) so `get_text_config()`, the KV cache
and `generate()` find it; the vision tower and the fusion module are this project's own modules, so
their settings are kept as plain JSON data (`vision_config` is the field dict of `mm.vision.VisionConfig`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from mm.config import from_dict, to_dict
from mm.multi_image import MultiImageConfig
from mm.vision import VisionConfig, resolve_pretrained

# A tiny Qwen2 for tests and the demo; real runs set `text_config` explicitly.
TINY_TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen2",
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


class NoteVLMConfig(PreTrainedConfig):
    """Config of :class:`mm.model.modeling.NoteVLMForConditionalGeneration` (keyword-only fields)."""

    model_type: ClassVar[str] = "notevlm"
    sub_configs_defaults: ClassVar[dict[str, SubConfigSpec]] = {
        "text_config": SubConfigSpec(
            config_class=AutoConfig, model_type="qwen2", init_kwargs=TINY_TEXT_CONFIG
        ),
    }

    vision_config: dict | None = None
    """Field dict of `mm.vision.VisionConfig` (empty = that class's defaults)."""
    fusion_kind: str = "mlp"
    """`mm.fusion.build_fusion` kind: "mlp", "qformer" or "resampler"."""
    fusion_budget: int = 16
    """K: LM tokens per image = `<image>` placeholders per image."""
    fusion_kwargs: dict | None = None
    """Extra keyword arguments of `build_fusion` (e.g. layers, heads; `FusionConfig.kind_kwargs()`)."""
    text_config: dict | PreTrainedConfig | None = None
    """The LM decoder's config (dict with `model_type`, or a `PreTrainedConfig`); tiny Qwen2 by default."""
    image_token_id: int = 4
    """Id of the `<image>` placeholder token in the tokenizer."""
    max_images: int = 4
    """Most images per note (image slots per sample)."""
    tie_word_embeddings: bool = False
    """Share the LM's input embedding with the output head (also taken from text_config)."""
    image_index_embeddings: bool = False
    """Add a learned embedding of the slot index n to every fusion token of image n (`image_index`), so
    the LM can tell "the second photo" from the first without counting `<im_start>` tokens. It trains
    and is saved with the fusion."""
    token_position_embeddings: bool = False
    """Add a learned embedding of the token's place k among an image's K fusion tokens to token k of
    every image (`token_position`, `mm.multi_image.TokenPositionEmbedding`), so a token's content says
    where in the photo it lies. It trains and is saved with the fusion."""
    visibility: str = "all"
    """What the LM's tokens may attend to (`mm.multi_image.visibility_mask`): "all" (plain causal) or "own"
    (each photo, and the text between it and the next photo, form a branch no other photo or branch sees;
    the prompt after the last photo sees all). Segments come from the `<image>` layout
    (`mm.multi_image.layout_ids`) or from the `segment_ids` argument of `forward`."""

    def __post_init__(self, **kwargs: Any) -> None:
        self.vision_config = dict(self.vision_config or {})
        if self.vision_config.get("pretrained") and self.vision_config.get("arch_config") is None:
            vision = from_dict(VisionConfig, self.vision_config, "vision_config")
            self.vision_config = to_dict(resolve_pretrained(vision))
        self.fusion_kwargs = dict(self.fusion_kwargs or {})
        super().__post_init__(**kwargs)
        if self.text_config.tie_word_embeddings:
            self.tie_word_embeddings = True
        if self.fusion_budget < 1:
            raise ValueError(
                f"NoteVLMConfig.fusion_budget must be >= 1 (tokens per image), got {self.fusion_budget}"
            )
        if self.max_images < 1:
            raise ValueError(f"NoteVLMConfig.max_images must be >= 1, got {self.max_images}")
        _ = self.multi_image  # validates visibility
        vocab = self.text_config.vocab_size
        if not 0 <= self.image_token_id < vocab:
            raise ValueError(
                f"NoteVLMConfig.image_token_id={self.image_token_id} is outside the LM vocabulary "
                f"[0, {vocab}); set it to the tokenizer's `<image>` id or grow text_config.vocab_size"
            )

    @property
    def multi_image(self) -> MultiImageConfig:
        """The note fields (`max_images`, `visibility`, `image_index_embeddings`) as one typed config."""
        try:
            return MultiImageConfig(
                max_images=self.max_images,
                visibility=self.visibility,
                index_embeddings=self.image_index_embeddings,
            )
        except ValueError as e:
            raise ValueError(f"NoteVLMConfig: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        """As transformers', without the vision tower's source path: a saved model holds its weights and
        rebuilds the tower from the resolved architecture (``vision_config.arch_config`` or the dims)."""
        out = super().to_dict()
        if out.get("vision_config", {}).get("pretrained") is not None:
            out["vision_config"] = {**out["vision_config"], "pretrained": None}
        return out
