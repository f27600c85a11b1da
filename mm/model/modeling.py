"""NoteVLM: vision tower -> fusion (K tokens per image) -> transformers causal LM.

The LLaVA convention (Liu et al., 2023, "Visual Instruction Tuning"; transformers'
`LlavaForConditionalGeneration`): the prompt holds K `<image>` placeholder tokens per image, and
their input embeddings are replaced, in order, by that image's K fusion outputs before the LM runs.
Deviations from LLaVA: a note has up to `max_images` images (`pixel_values` is (B, N, 3, H, W) with an
`image_mask` (B, N) marking real slots), and the projector is any `mm.fusion` kind at a fixed budget K.

Image features are computed only when `pixel_values` is given, i.e. on the prefill step of cached
generation (transformers drops `pixel_values` from later steps); decode steps only embed new tokens.

Multi-image notes (`mm.multi_image`): optional slot index embeddings on the fusion tokens, and the LM's
visibility mode (`config.visibility`). For "own", every forward that holds the note's
`<image>` tokens (training, scoring, the prefill of cached generation, each step of uncached generation)
gets a 4D mask (B, 1, T, T) built from the `<image>` layout; decode steps of cached generation keep the 2D
mask, since text after the last photo is shared and sees everything in every mode.

Budget per note (fusion ``budget_per: note``): the fusion yields K tokens for the whole note, written as
one `<image>` block (NoteProcessor with ``budget_per="note"``). Those tokens mix every photo, so they
belong to no photo: under "own" they are shared (like a shared prompt: they see everything before them
and every later token sees them), and only caller-given text segments still hide each other.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

import torch
from torch import nn
from transformers import AutoModel, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from mm.config import from_dict
from mm.fusion import build_fusion
from mm.model.configuration import NoteVLMConfig
from mm.multi_image import ImageIndexEmbedding, TokenPositionEmbedding, layout_ids, visibility_mask
from mm.vision import VisionConfig, build_vision_tower

# transformers >= 5.24 names the KV cache `cache` (argument and output field); earlier versions
# `past_key_values`. NoteVLM accepts both names and talks to its LM and outputs in the installed one's.
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def build_vision_and_fusion(config: NoteVLMConfig) -> tuple[nn.Module, nn.Module]:
    """The vision tower and fusion module described by ``config`` (a note-scope fusion gets max_images)."""
    tower = build_vision_tower(from_dict(VisionConfig, dict(config.vision_config), "vision_config"))
    kwargs = dict(config.fusion_kwargs)
    if kwargs.get("scope") == "note":
        kwargs.setdefault("max_images", config.max_images)
    fusion = build_fusion(
        config.fusion_kind,
        budget=config.fusion_budget,
        d_vision=tower.dim,
        d_model=config.text_config.hidden_size,
        grid=tower.grid,
        **kwargs,
    )
    return tower, fusion


class NoteVLMPreTrainedModel(PreTrainedModel):
    """Shared transformers plumbing (config class, checkpointing and attention support flags)."""

    config_class = NoteVLMConfig
    base_model_prefix = "model"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules: list[str] = []

    def _init_weights(self, module: nn.Module) -> None:
        """Leave vision tower and fusion parameters to their own constructors; restore their buffers.

        transformers' generic init (normal(0.02) on every Linear) would overwrite the tower's pretrained
        weights and the fusion's own init, so it is not applied to them (the LM, a `PreTrainedModel`, is
        initialised by its own `_init_weights`). `from_pretrained` builds the model on the meta device, which
        leaves non-persistent buffers (e.g. the resampler's 2D sin-cos positions) uninitialised; they are
        recomputed here from a fresh CPU build of the same part.
        """
        owned = self._vision_fusion_modules()
        if id(module) not in owned:
            super()._init_weights(module)  # e.g. lm_head
            return
        part, name = owned[id(module)]
        if not module._non_persistent_buffers_set:
            return
        # function-level: transformers.initialization exists from transformers 5 on (pyproject allows 4.56)
        from transformers import initialization as init

        source = _fresh_parts(self.config)[part].get_submodule(name)
        for b in module._non_persistent_buffers_set:
            target = getattr(module, b)
            if target is not None:
                init.copy_(target, getattr(source, b).to(target.device, target.dtype))

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """transformers' save, plus NoteVLM's own code and ``auto_map`` (`mm.model.remote_code`), so the
        folder loads with ``trust_remote_code=True`` where notelens is not installed."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if not kwargs.get("is_main_process", True):
            return
        try:  # by name: the copy of this file in a saved folder runs without notelens and skips this step
            remote_code = importlib.import_module("mm.model.remote_code")
        except ModuleNotFoundError:
            return
        remote_code.write_remote_code(save_directory)

    def _vision_fusion_modules(self) -> dict[int, tuple[str, str]]:
        """id(module) -> (part, name inside the part) for every module of the vision tower and fusion."""
        table = {
            id(m): (part, name)
            for part in ("vision_tower", "fusion")
            for name, m in getattr(self, part).named_modules()
        }
        return table


def _fresh_parts(config: NoteVLMConfig) -> dict[str, nn.Module]:
    """A CPU build of the vision tower and fusion (buffers only are used; pretrained weights not read)."""
    key = config.to_json_string(use_diff=False)
    if _FRESH_CACHE.get("key") != key:
        cfg = copy.deepcopy(config)
        if "pretrained" in cfg.vision_config:
            cfg.vision_config["pretrained"] = None
        with torch.device("cpu"):
            tower, fusion = build_vision_and_fusion(cfg)
        _FRESH_CACHE.clear()
        _FRESH_CACHE.update(key=key, parts={"vision_tower": tower, "fusion": fusion})
    return _FRESH_CACHE["parts"]


_FRESH_CACHE: dict[str, Any] = {}


class NoteVLMModel(NoteVLMPreTrainedModel):
    """The backbone: vision tower + fusion + the LM's decoder (no output head); returns hidden states.

    Submodules: ``vision_tower`` (B, N, 3, H, W) -> (B, N, P, Dv); ``fusion`` (B, N, P, Dv) -> (B, N, K, D);
    ``language_model`` the decoder (`AutoModel.from_config(text_config)`, e.g. `Qwen2Model`).
    """

    def __init__(self, config: NoteVLMConfig) -> None:
        super().__init__(config)
        self.vision_tower, self.fusion = build_vision_and_fusion(config)
        self.language_model = AutoModel.from_config(config.text_config)
        multi = config.multi_image
        if multi.index_embeddings and self.fusion.budget_per == "note":
            raise ValueError(
                "image_index_embeddings tag each image's tokens with its slot, but a fusion with budget_per "
                "'note' yields one block of tokens per note (its patch slot embeddings already tag the "
                "photos); set image_index_embeddings: false"
            )
        self.image_index = (
            ImageIndexEmbedding(max_images=multi.max_images, dim=config.text_config.hidden_size)
            if multi.index_embeddings
            else None
        )
        self.token_position = (
            TokenPositionEmbedding(tokens=config.fusion_budget, dim=config.text_config.hidden_size)
            if getattr(config, "token_position_embeddings", False)
            else None
        )
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.language_model.set_input_embeddings(value)

    # --- images ---
    def get_image_features(
        self, pixel_values: torch.Tensor, image_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fusion tokens (B, S, K, D) and the bool slot mask (B, N) for ``pixel_values`` (B, N, 3, H, W);
        S = N, or 1 for a fusion with budget_per "note" (K tokens per note)."""
        if pixel_values.dim() != 5:
            raise ValueError(
                f"pixel_values must be (B, N_images, 3, H, W), got shape {tuple(pixel_values.shape)}; "
                "use NoteProcessor to build model inputs"
            )
        B, N = pixel_values.shape[:2]
        if N > self.config.max_images:
            raise ValueError(
                f"got {N} image slots per note but config.max_images={self.config.max_images}; "
                "drop images or raise max_images"
            )
        if image_mask is None:
            image_mask = torch.ones(B, N, dtype=torch.bool, device=pixel_values.device)
        image_mask = image_mask.to(device=pixel_values.device, dtype=torch.bool)
        if image_mask.shape != (B, N):
            raise ValueError(f"image_mask must be (B, N)=({B}, {N}), got {tuple(image_mask.shape)}")
        patches = self.vision_tower(pixel_values.to(self.dtype), image_mask)  # (B, N, P, Dv)
        tokens, token_mask = self.fusion(patches, image_mask)  # (B, S, K, D), (B, S, K)
        if self.image_index is not None:
            tokens = self.image_index(tokens, token_mask)  # (B, N, K, D); padded slots stay 0
        if self.token_position is not None:
            tokens = self.token_position(tokens, token_mask)  # (B, S, K, D); padded slots stay 0
        return tokens, image_mask

    def merge_image_tokens(
        self,
        input_ids: torch.Tensor,
        inputs_embeds: torch.Tensor,
        image_tokens: torch.Tensor,
        image_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Replace each note's `<image>` embeddings (B, T, D) by its fusion tokens (B, S, K, D), in order."""
        K = self.config.fusion_budget
        per_note = self.fusion.budget_per == "note"
        slots = image_mask.any(1, keepdim=True) if per_note else image_mask  # (B, S) token groups of K
        placeholders = input_ids == self.config.image_token_id  # (B, T)
        found = placeholders.sum(dim=1)  # (B,)
        expected = slots.sum(dim=1) * K  # (B,)
        if not torch.equal(found, expected):
            bad = int((found != expected).nonzero()[0, 0])
            what = "1 note block" if per_note else f"{int(image_mask[bad].sum())} image(s)"
            raise ValueError(
                f"sample {bad}: found {int(found[bad])} `<image>` tokens in input_ids but it has "
                f"{what} x K={K} = {int(expected[bad])} fusion tokens; build inputs with NoteProcessor "
                "(tokens_per_image and budget_per as the model's fusion) and do not truncate image tokens"
            )
        feats = image_tokens[slots]  # (n_groups, K, D), note-major then image order
        feats = feats.reshape(-1, feats.shape[-1]).to(inputs_embeds.dtype)  # (n_real * K, D)
        return inputs_embeds.masked_scatter(placeholders.unsqueeze(-1), feats)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        image_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        segment_ids: torch.LongTensor | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """Decoder hidden states (B, T, D) with the `<image>` placeholders filled by fusion tokens.

        The KV cache may come as ``cache`` (transformers >= 5.24) or ``past_key_values``.
        ``segment_ids`` (B, T), for visibility "own" only: the photo each text token belongs
        to (-1 = shared text); None derives them from the `<image>` layout (`mm.multi_image.layout_ids`).
        """
        if cache is not None and past_key_values is not None and cache is not past_key_values:
            raise ValueError("pass the KV cache as `cache` or as `past_key_values`, not both")
        cache = cache if cache is not None else past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)  # (B, T, D)
        if pixel_values is not None:
            if input_ids is None:
                raise ValueError("pixel_values need input_ids (to find the `<image>` placeholders)")
            image_tokens, image_mask = self.get_image_features(pixel_values, image_mask)
            inputs_embeds = self.merge_image_tokens(input_ids, inputs_embeds, image_tokens, image_mask)
        elif (
            input_ids is not None and cache is None and bool((input_ids == self.config.image_token_id).any())
        ):
            raise ValueError(
                "input_ids contain `<image>` placeholders but no pixel_values were given; "
                "pass the note's images"
            )
        attention_mask = self.note_attention_mask(
            input_ids, attention_mask, segment_ids, cache, inputs_embeds
        )  # (B, T), or (B, 1, T, T) under visibility "own"
        return self.language_model(
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **{_CACHE_FIELD: cache},
            **kwargs,
        )

    def note_attention_mask(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        segment_ids: torch.Tensor | None,
        cache: Any,
        inputs_embeds: torch.Tensor,
    ) -> torch.Tensor | None:
        """The LM's attention mask under ``config.visibility``: the 2D mask as given for "all" and for decode
        steps, else a 4D (B, 1, T, T) mask (bool for sdpa, additive for eager) from the `<image>` layout."""
        mode = self.config.visibility
        if mode == "all":
            if segment_ids is not None:
                raise ValueError("segment_ids only apply to visibility 'own'; this model's config has 'all'")
            return attention_mask
        if attention_mask is not None and attention_mask.dim() == 4:
            return attention_mask  # a caller-built 4D mask is used as given
        if input_ids is None:
            raise ValueError(f"visibility {mode!r} needs input_ids (the `<image>` layout), not inputs_embeds")
        past = cache.get_seq_length() if cache is not None else 0
        has_images = bool((input_ids == self.config.image_token_id).any())
        if past > 0:
            if has_images or segment_ids is not None:
                raise ValueError(
                    f"visibility {mode!r}: `<image>` tokens or segment_ids after cached tokens (chunked "
                    "prefill) are not supported; prefill the whole prompt in one forward"
                )
            return attention_mask  # decode steps: text after the last photo is shared (sees everything)
        impl = self.language_model.config._attn_implementation
        if impl not in ("sdpa", "eager"):
            raise ValueError(
                f"visibility {mode!r} needs a 4D attention mask, which attn_implementation={impl!r} does not "
                "take; load the model with attn_implementation='sdpa' or 'eager'"
            )
        if self.fusion.budget_per == "note":  # the note block mixes every photo: shared, like a prompt
            image_ids = derived = torch.full_like(input_ids, -1)  # (B, T)
        else:
            image_ids, derived = layout_ids(
                input_ids,
                image_token_id=self.config.image_token_id,
                tokens_per_image=self.config.fusion_budget,
            )  # (B, T), (B, T)
        if segment_ids is not None and segment_ids.shape != input_ids.shape:
            raise ValueError(
                f"segment_ids must be (B, T)={tuple(input_ids.shape)} like input_ids, got "
                f"{tuple(segment_ids.shape)}"
            )
        segments = derived if segment_ids is None else segment_ids.to(input_ids.device)
        return visibility_mask(
            image_ids,
            segments,
            mode=mode,
            attention_mask=attention_mask,
            additive=impl == "eager",
            dtype=inputs_embeds.dtype,
        )  # (B, 1, T, T)


class NoteVLMForConditionalGeneration(NoteVLMPreTrainedModel, GenerationMixin):
    """A note-understanding VLM with the transformers API (`from_pretrained`, `generate`, PEFT, TRL).

    Layout as `LlavaForConditionalGeneration`: ``model`` (:class:`NoteVLMModel`, also `base_model`) and
    ``lm_head``; ``vision_tower``, ``fusion`` and ``language_model`` are shortcuts into ``model``.
    """

    _tied_weights_keys = {"lm_head.weight": "model.language_model.embed_tokens.weight"}

    def __init__(self, config: NoteVLMConfig) -> None:
        super().__init__(config)
        self.model = NoteVLMModel(config)
        text = config.text_config
        self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.post_init()
        # A generated `<image>` would need image features (uncached decoding would fail): never emit it.
        self.generation_config.suppress_tokens = [config.image_token_id]

    @property
    def vision_tower(self) -> nn.Module:
        return self.model.vision_tower

    @property
    def fusion(self) -> nn.Module:
        return self.model.fusion

    @property
    def language_model(self) -> nn.Module:
        return self.model.language_model

    @property
    def image_index(self) -> nn.Module | None:
        return self.model.image_index

    @property
    def token_position(self) -> nn.Module | None:
        return self.model.token_position

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def get_image_features(
        self, pixel_values: torch.Tensor, image_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`NoteVLMModel.get_image_features`."""
        return self.model.get_image_features(pixel_values, image_mask)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        image_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        segment_ids: torch.LongTensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Logits (B, T, V) and, with ``labels`` (B, T; -100 = ignored; shifted inside), the LM loss.

        Shapes: input_ids (B, T); attention_mask (B, T); pixel_values (B, N, 3, H, W); image_mask (B, N).
        The KV cache may come as ``cache`` (transformers >= 5.24) or ``past_key_values``.
        ``segment_ids`` (B, T): see :meth:`NoteVLMModel.forward` (visibility "own").
        """
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            pixel_values=pixel_values,
            image_mask=image_mask,
            position_ids=position_ids,
            cache=cache,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            segment_ids=segment_ids,
            **kwargs,
        )
        hidden = out.last_hidden_state  # (B, T, D)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden[:, keep, :])  # (B, T', V)
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.text_config.vocab_size, **kwargs
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            **{_CACHE_FIELD: getattr(out, _CACHE_FIELD)},
        )

    def prepare_inputs_for_generation(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """As transformers does, plus: `image_mask` travels with `pixel_values` (prefill only when cached)."""
        inputs = super().prepare_inputs_for_generation(*args, **kwargs)
        if inputs.get("pixel_values") is None:
            inputs.pop("image_mask", None)
        return inputs
