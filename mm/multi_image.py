"""Multi-image notes: image index embeddings, a pooled note embedding, text->image visibility masks.

A note has up to ``max_images`` image slots; ``image_mask`` (B, N) marks the real ones. Fusion
output ``tokens`` (B, N, K, D) with ``token_mask`` (B, N, K) comes from :mod:`mm.fusion`.

- :class:`ImageIndexEmbedding` adds a learned embedding of the slot index n to image n's K tokens,
  so text can refer to "image 2". Padded slots stay exactly zero.
- :class:`NotePooler`: masked mean over the valid images' tokens, then a Linear -> (B, D_out), the
  note-level embedding used for retrieval.
- :func:`visibility_mask` builds the LM attention mask of a packed sequence (text + image tokens):
  mode "all" (causal; every text token sees every earlier image token) or "own" (a text token of
  segment s sees only the tokens of image s, plus all earlier text tokens).

Padded image slots contribute nothing anywhere: they are zero, masked out of attention and of the
pooled mean, and receive exactly zero gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

VISIBILITY_MODES = ("all", "own")


@dataclass
class MultiImageConfig:
    """How a note's images are tagged and seen by the text."""

    max_images: int = 4
    """Most image slots per note; the index embedding table has this many rows."""
    visibility: str = "all"
    """Text->image visibility: "all" (every text token sees all images) or "own" (its segment's image)."""

    def __post_init__(self) -> None:
        if self.max_images < 1:
            raise ValueError(f"max_images must be >= 1, got {self.max_images}")
        if self.visibility not in VISIBILITY_MODES:
            raise ValueError(f"visibility must be one of {VISIBILITY_MODES}, got {self.visibility!r}")


def _check_tokens(tokens: torch.Tensor, token_mask: torch.Tensor) -> None:
    if tokens.dim() != 4:
        raise ValueError(f"tokens must be (B, N_img, K, D), got shape {tuple(tokens.shape)}")
    if token_mask.shape != tokens.shape[:3]:
        raise ValueError(
            f"token_mask must be (B, N_img, K)={tuple(tokens.shape[:3])}, got {tuple(token_mask.shape)}"
        )


class ImageIndexEmbedding(nn.Module):
    """Add a learned per-slot embedding ``E[n]`` to every token of image n; padded tokens stay 0."""

    def __init__(self, *, max_images: int = 4, dim: int):
        super().__init__()
        self.max_images = max_images
        self.embedding = nn.Embedding(max_images, dim)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        _check_tokens(tokens, token_mask)
        B, N, K, D = tokens.shape
        if N > self.max_images:
            raise ValueError(
                f"a note has {N} image slots but max_images={self.max_images}; "
                "raise max_images or drop images from the note"
            )
        idx = self.embedding.weight[:N]  # (N, D)
        keep = token_mask[..., None].to(tokens.dtype)  # (B, N, K, 1)
        return (tokens + idx[None, :, None, :]) * keep  # (B, N, K, D)


class NotePooler(nn.Module):
    """Note embedding for retrieval: masked mean over the valid images' tokens -> Linear -> (B, D_out)."""

    def __init__(self, *, dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, out_dim)

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        _check_tokens(tokens, token_mask)
        count = token_mask.sum((1, 2))  # (B,)
        if bool((count == 0).any()):
            bad = torch.nonzero(count == 0).flatten().tolist()
            raise ValueError(f"notes {bad} have no valid image tokens; every note needs at least one image")
        keep = token_mask[..., None].to(tokens.dtype)  # (B, N, K, 1)
        mean = (tokens * keep).sum((1, 2)) / count[:, None].to(tokens.dtype)  # (B, D)
        return self.proj(mean)  # (B, D_out)


def visibility_mask(
    image_ids: torch.Tensor,
    segment_ids: torch.Tensor | None = None,
    *,
    mode: str = "all",
    attention_mask: torch.Tensor | None = None,
    additive: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The (B, 1, T, T) attention mask of a packed text+image sequence, usable as a 4D HF mask.

    Args:
        image_ids: (B, T) long; the image index of each image token, -1 for text tokens.
        segment_ids: (B, T) long; for text tokens in mode "own", the image whose segment the token
            belongs to, or -1 for text that may see every image (e.g. a shared prompt). Needed
            only for mode "own"; ignored on image tokens.
        mode: "all": plain causal attention (every text token sees every earlier image token).
            "own": causal, but a text token of segment s sees only image s's tokens among the images.
        attention_mask: (B, T) 1/True for real tokens, 0/False for padding (padding keys are hidden).
        additive: False -> bool mask, True = may attend (SDPA convention). True -> float mask of
            ``dtype`` with 0 where allowed and ``finfo(dtype).min`` elsewhere (eager attention).

    Image tokens attend causally like any token. Each query always sees itself, so no row is
    empty (a fully masked row would give NaN in softmax).
    """
    if mode not in VISIBILITY_MODES:
        raise ValueError(f"visibility mode must be one of {VISIBILITY_MODES}, got {mode!r}")
    if image_ids.dim() != 2:
        raise ValueError(f"image_ids must be (B, T), got shape {tuple(image_ids.shape)}")
    B, T = image_ids.shape
    device = image_ids.device
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T) query i, key j <= i
    allowed = causal[None].expand(B, T, T)  # (B, T, T)
    if mode == "own":
        if segment_ids is None or segment_ids.shape != (B, T):
            got = None if segment_ids is None else tuple(segment_ids.shape)
            raise ValueError(f"mode 'own' needs segment_ids of shape (B, T)=({B}, {T}), got {got}")
        q_text = (image_ids < 0)[:, :, None]  # (B, T, 1)
        k_image = (image_ids >= 0)[:, None, :]  # (B, 1, T)
        q_seg = segment_ids[:, :, None]  # (B, T, 1)
        sees_image = (q_seg < 0) | (q_seg == image_ids[:, None, :])  # (B, T, T)
        allowed = allowed & ~(q_text & k_image & ~sees_image)
    if attention_mask is not None:
        if attention_mask.shape != (B, T):
            raise ValueError(f"attention_mask must be (B, T)=({B}, {T}), got {tuple(attention_mask.shape)}")
        allowed = allowed & attention_mask.to(torch.bool)[:, None, :]
    allowed = allowed | torch.eye(T, dtype=torch.bool, device=device)[None]  # never an empty row
    allowed = allowed[:, None]  # (B, 1, T, T)
    if not additive:
        return allowed
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)
