"""The pretraining model (note encoder + text encoder + temperature) and its losses.

pixel_values (B, N, 3, H, W) -> vision tower -> patches (B, N, P, Dv) -> fusion (any kind, budget K)
-> tokens (B, N, K, D) -> mean over K -> per-image MLP (+ image index embedding,
:class:`mm.multi_image.ImageIndexEmbedding`, the one NoteVLM uses) -> masked mean over images ->
projection -> L2-normalised note embedding (B, E). A fusion with budget_per "note" yields one group of K
tokens per note (B, 1, K, D): the same path with one slot and no index embedding (nothing per image).
text ids (B, T) -> TextEncoder -> projection -> L2-normalised text embedding (B, E)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mm import contrastive
from mm.errors import UserError
from mm.fusion import MLPProjector, build_fusion_from_config
from mm.multi_image import ImageIndexEmbedding
from mm.train.pretrain.config import LossConfig, PretrainModelConfig
from mm.train.text_encoder import TextEncoder
from mm.vision import VisionConfig, build_vision_tower, normalisation, resolve_pretrained


class NoteTextModel(nn.Module):
    """Note encoder + text encoder + temperature; ``forward`` returns normalised embeddings."""

    def __init__(
        self, *, cfg: PretrainModelConfig, loss: LossConfig, vocab_size: int, num_tags: int = 0
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = build_vision_tower(_stretched_half_normalised(cfg.vision))
        self.fusion = build_fusion_from_config(
            cfg.fusion, d_vision=self.vision.dim, d_model=cfg.d_model, grid=self.vision.grid
        )
        if cfg.fusion.budget_per == "note" and (num_tags or loss.multi_positive):
            raise UserError(
                "fusion budget_per 'note' yields tokens per note, not per image, so per-image tag heads "
                "and loss.multi_positive have nothing to read; set budget_per: image, or turn off the tag "
                "loss and multi_positive"
            )
        # std=None: nn.Embedding's N(0, 1) init; the key stays image_index.weight, so checkpoints written
        # when this was a plain nn.Embedding load as they are
        self.image_index = ImageIndexEmbedding(max_images=cfg.max_images, dim=cfg.d_model, std=None)
        self.image_mlp = nn.Sequential(
            nn.LayerNorm(cfg.d_model),
            nn.Linear(cfg.d_model, cfg.d_model),
            nn.GELU(),
            nn.Linear(cfg.d_model, cfg.d_model),
        )
        self.note_proj = nn.Linear(cfg.d_model, cfg.embed_dim, bias=False)
        self.text = TextEncoder(cfg=cfg.text, vocab_size=vocab_size)
        self.text_proj = nn.Linear(cfg.text.width, cfg.embed_dim, bias=False)
        init = torch.tensor(contrastive.init_logit_scale(loss.init_temperature))
        if loss.learn_temperature:
            self.log_scale = nn.Parameter(init)
        else:
            self.register_buffer("log_scale", init)
        if loss.kind == "siglip":
            self.logit_bias = nn.Parameter(torch.tensor(contrastive.init_logit_bias()))
        else:
            self.logit_bias = None
        self.tag_head = nn.Linear(cfg.d_model, num_tags) if num_tags else None
        self.tag_scope = loss.tag_scope
        if num_tags and loss.tag_scope != "image":
            pooled = getattr(self.fusion, "pooled_grid", None)  # only the mlp fusion keeps a patch grid
            if not isinstance(self.fusion, MLPProjector) or pooled != self.vision.grid:
                raise UserError(
                    f"loss.tag_scope: token tags each fusion token with the objects of its patch, so the "
                    f"tokens must be the patches: model.fusion kind mlp with budget = "
                    f"{self.vision.grid[0] * self.vision.grid[1]} (the {self.vision.grid} patch grid), got "
                    f"kind {cfg.fusion.kind!r} with budget {cfg.fusion.budget}; or use loss.tag_scope: image"
                )

    def encode_images(
        self, pixel_values: torch.Tensor, image_mask: torch.Tensor, *, tags: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, N, 3, H, W), (B, N) -> per-image features (B, N, D) (zeros at padded slots); with ``tags``
        also the tag logits of the tag head: (B, N, C) per image, or (B, N, K, C) per token with
        ``loss.tag_scope: token`` or ``both``. Budget per note: one note slot, (B, 1, D)."""
        B, N = image_mask.shape
        if N > self.cfg.max_images:
            raise ValueError(f"notes have {N} image slots, model.max_images is {self.cfg.max_images}")
        patches = self.vision(pixel_values, image_mask)  # (B, N, P, Dv)
        tokens, token_mask = self.fusion(patches, image_mask)  # (B, S, K, D), (B, S, K); S = N or 1
        token_mask = token_mask.to(torch.bool)
        slots = token_mask.any(2)  # (B, S)
        m = token_mask[..., None].to(tokens.dtype)  # (B, S, K, 1)
        per_image = (tokens * m).sum(2) / m.sum(2).clamp(min=1.0)  # (B, S, D)
        tagged = self.image_index.add_per_image(per_image, slots) if tokens.shape[1] == N else per_image
        per_image = per_image + self.image_mlp(tagged)  # (B, S, D)
        per_image = per_image * slots[..., None].to(per_image.dtype)
        if not tags:
            return per_image
        if self.tag_head is None:
            raise ValueError("this model has no tag head (built with num_tags=0)")
        # multiple-instance tagging: a class is in the image when ANY token says so, so each token's own
        # logits are max-pooled (a Linear over max-pooled features cannot single out one token's object:
        # it plateaued at tag loss 0.13, the tower reading only the theme; per-token logits reach ~0.02)
        logits = self.tag_head(tokens)  # (B, N, K, C)
        if self.tag_scope != "image":  # every token answers for its own patch
            return per_image, torch.where(image_mask[..., None, None], logits, torch.zeros_like(logits))
        logits = logits.masked_fill(~token_mask[..., None], float("-inf")).amax(2)  # (B, N, C)
        logits = torch.where(image_mask[..., None], logits, torch.zeros_like(logits))  # no -inf at padding
        return per_image, logits  # (B, N, D), (B, N, C)

    def encode_note(
        self, pixel_values: torch.Tensor, image_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised note embeddings (B, E) and per-image embeddings (B, N, E) ((B, 1, E) per note)."""
        return self._pool(self.encode_images(pixel_values, image_mask), image_mask)

    def _pool(self, per_image: torch.Tensor, image_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if per_image.shape[1] != image_mask.shape[1]:  # budget per note: one slot per note
            image_mask = image_mask.any(1, keepdim=True)  # (B, 1)
        w = image_mask[..., None].to(per_image.dtype)  # (B, S, 1)
        pooled = (per_image * w).sum(1) / w.sum(1).clamp(min=1.0)  # (B, D)
        note = F.normalize(self.note_proj(pooled), dim=-1)  # (B, E)
        images = F.normalize(self.note_proj(per_image), dim=-1) * w  # (B, N, E)
        return note, images

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T), (B, T) -> normalised text embeddings (B, E)."""
        return F.normalize(self.text_proj(self.text(input_ids, attention_mask)), dim=-1)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if self.tag_head is not None:
            per_image, out["tag_logits"] = self.encode_images(
                batch["pixel_values"], batch["image_mask"], tags=True
            )
        else:
            per_image = self.encode_images(batch["pixel_values"], batch["image_mask"])
        out["note"], out["images"] = self._pool(per_image, batch["image_mask"])
        out["text"] = self.encode_text(batch["input_ids"], batch["attention_mask"])
        return out


def _stretched_half_normalised(vision: VisionConfig) -> VisionConfig:
    """``vision`` if the tower takes what `mm pretrain` feeds it (images stretched to the square, pixels
    scaled to [-1, 1], i.e. mean = std = 0.5), else a UserError saying how to accept that."""
    mean, std = normalisation(resolve_pretrained(vision))
    if vision.resize != "stretch" or mean != [0.5] * 3 or std != [0.5] * 3:
        raise UserError(
            f"mm pretrain stretches images and scales pixels to [-1, 1] (mean = std = 0.5), but the vision "
            f"tower asks for resize={vision.resize!r}, mean={mean}, std={std} (its pretrained source's); "
            "set model.vision.resize: stretch, image_mean: [0.5, 0.5, 0.5] and image_std: [0.5, 0.5, 0.5] "
            "to pretrain it that way (mm train then uses the same numbers)"
        )
    return vision


def scoped_tag_loss(
    logits: torch.Tensor,
    tags: torch.Tensor,
    image_mask: torch.Tensor,
    scope: str,
    *,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`tag_loss` of ``loss.tag_scope``: as given for "image" and "token"; for "both", logits and
    tags (B, N, K, C) per token, the per-token loss plus the loss of their max over the K tokens."""
    loss = tag_loss(logits, tags, image_mask, count=count)
    if scope == "both":
        loss = loss + tag_loss(logits.amax(2), tags.amax(2), image_mask, count=count)  # (B, N, C) each
    return loss


def tag_loss(
    logits: torch.Tensor, tags: torch.Tensor, image_mask: torch.Tensor, *, count: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean multi-label BCE over the real images: logits (B, N, C), tags (B, N, C) in {0, 1}, mask (B, N);
    or per token, logits and tags (B, N, K, C) (an image's loss is then the mean over its K tokens).

    ``count`` replaces the number of real images the sum is divided by (default: this batch's). Under DDP
    pass (real images of the global batch) / world, so that DDP's gradient average is the global mean.
    """
    if logits.shape != tags.shape:
        raise ValueError(
            f"tag logits {tuple(logits.shape)} and tags {tuple(tags.shape)} differ; per-token tags need the "
            "data loaded with the model's token grid (mm.train.pretrain.tag_grid)"
        )
    per = F.binary_cross_entropy_with_logits(logits, tags.to(logits.dtype), reduction="none")
    per = per.flatten(2).mean(-1)  # (B, N): mean over classes (and tokens)
    m = image_mask.to(per.dtype)
    return (per * m).sum() / (m.sum() if count is None else count).clamp(min=1.0)


def contrastive_loss(
    out: dict[str, torch.Tensor],
    image_mask: torch.Tensor,
    *,
    log_scale: torch.Tensor,
    logit_bias: torch.Tensor | None,
    cfg: LossConfig,
) -> torch.Tensor:
    """The configured loss on features gathered (with gradients) across DDP ranks."""
    scale = log_scale.exp()
    text = contrastive.gather_with_grad(out["text"])  # (W*B, E)
    if cfg.multi_positive:
        images = contrastive.gather_with_grad(out["images"])  # (W*B, N, E)
        mask = contrastive.gather_no_grad(image_mask)  # (W*B, N)
        if cfg.kind == "clip":
            return contrastive.multi_positive_clip_loss(
                images, mask, text, scale, label_smoothing=cfg.label_smoothing
            )
        flat, valid = images.flatten(0, 1), mask.flatten()  # (W*B*N, E), (W*B*N,)
        owner = torch.arange(mask.shape[0], device=mask.device).repeat_interleave(mask.shape[1])
        pos = owner[valid][:, None] == torch.arange(text.shape[0], device=mask.device)[None, :]
        return contrastive.siglip_loss(flat[valid], text, scale, logit_bias, positive_mask=pos)
    note = contrastive.gather_with_grad(out["note"])  # (W*B, E)
    if cfg.kind == "clip":
        return contrastive.clip_loss(note, text, scale, label_smoothing=cfg.label_smoothing)
    return contrastive.siglip_loss(note, text, scale, logit_bias)
