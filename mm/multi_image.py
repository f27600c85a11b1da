"""Multi-image notes: image index embeddings, a pooled note embedding, text->image visibility masks.

A note has up to ``max_images`` image slots; ``image_mask`` (B, N) marks the real ones. Fusion
output ``tokens`` (B, N, K, D) with ``token_mask`` (B, N, K) comes from :mod:`mm.fusion`.

- :class:`ImageIndexEmbedding` adds a learned embedding of the slot index n to image n's K tokens,
  so text can refer to "image 2". Padded slots stay exactly zero.
- :class:`NotePooler`: masked mean over the valid images' tokens, then a Linear -> (B, D_out), the
  note-level embedding used for retrieval.
- :func:`visibility_mask` builds the LM attention mask of a packed sequence (text + image tokens):
  mode "all" (causal; every token sees every earlier token) or "own" (image s and the text of segment
  s form a branch that sees only itself and shared text: no image sees another image and no segment
  sees another segment's text, so nothing of image t reaches a token of segment s != t, not even
  through the hidden states of other tokens; shared text sees everything before it).
- :func:`layout_ids` derives image and segment ids from a NoteVLM token sequence (`<image>` runs).

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
    """Visibility in the LM: "all" (plain causal) or "own" (photo + segment branches that never see each
    other; shared text sees everything before it)."""
    index_embeddings: bool = False
    """Add a learned embedding of slot n to every fusion token of image n (:class:`ImageIndexEmbedding`)."""

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


class ImageIndexEmbedding(nn.Embedding):
    """Add a learned per-slot embedding ``E[n]`` (row n of ``weight``) to every token of image n.

    An ``nn.Embedding`` (``weight`` is (max_images, D)), so a model holding it as ``image_index`` saves
    the tensor ``image_index.weight`` (the key a plain ``nn.Embedding`` there had: such checkpoints load
    as they are). Padded tokens stay exactly 0. Used by NoteVLM (on its fusion tokens) and by the
    pretraining note encoder (on its per-image features, as K = 1 tokens: :meth:`add_per_image`).

    ``std``: the init N(0, std^2) of the rows; None keeps ``nn.Embedding``'s N(0, 1) (the pretraining
    model's init, so its seeded runs draw the same numbers).
    """

    def __init__(self, *, max_images: int = 4, dim: int, std: float | None = 0.02):
        super().__init__(max_images, dim)
        self.max_images = max_images
        if std is not None:
            nn.init.normal_(self.weight, std=std)

    def add_per_image(self, features: torch.Tensor, image_mask: torch.Tensor) -> torch.Tensor:
        """Per-image features (B, N, D) and slot mask (B, N) -> features + E[n] (B, N, D); padded slots 0."""
        if features.dim() != 3:
            raise ValueError(f"features must be (B, N_img, D), got shape {tuple(features.shape)}")
        return self(features[:, :, None], image_mask.to(torch.bool)[:, :, None])[:, :, 0]  # (B, N, D)

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        _check_tokens(tokens, token_mask)
        B, N, K, D = tokens.shape
        if N > self.max_images:
            raise ValueError(
                f"a note has {N} image slots but max_images={self.max_images}; "
                "raise max_images or drop images from the note"
            )
        idx = self.weight[:N].to(tokens.dtype)  # (N, D)
        keep = token_mask[..., None].to(tokens.dtype)  # (B, N, K, 1)
        return (tokens + idx[None, :, None, :]) * keep  # (B, N, K, D)


class TokenPositionEmbedding(nn.Embedding):
    """Add a learned embedding ``E[k]`` (row k of ``weight``, (K, D)) to token k of every image.

    An image's K fusion tokens come in a fixed order (the mlp fusion's pooled grid, row-major; a query
    index for qformer / resampler), but the fusion need not write that place into the token's content:
    an LM with relative positions (RoPE) then has to count from ``<im_start>`` to tell where in a photo
    a token lies. With this, the place is in the content. Padded tokens stay exactly 0.
    """

    def __init__(self, *, tokens: int, dim: int, std: float = 0.02):
        super().__init__(tokens, dim)
        nn.init.normal_(self.weight, std=std)

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        _check_tokens(tokens, token_mask)
        K = tokens.shape[2]
        if K != self.num_embeddings:
            raise ValueError(f"tokens have K={K} per image but the table has {self.num_embeddings} rows")
        keep = token_mask[..., None].to(tokens.dtype)  # (B, N, K, 1)
        return (tokens + self.weight.to(tokens.dtype)[None, None]) * keep  # (B, N, K, D)


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
            belongs to, or -1 for shared text that sees, and is seen by, everything (e.g. a shared
            prompt). Needed only for mode "own"; ignored on image tokens.
        mode: "all": plain causal attention (every token sees every earlier token).
            "own": causal, and a token of group g (image g, or text of segment g) sees only keys of group
            g and shared text (segment -1); shared text sees everything before it. So image tokens do not
            see other images, and a segment sees neither other images nor other segments' text.
        attention_mask: (B, T) 1/True for real tokens, 0/False for padding (padding keys are hidden).
        additive: False -> bool mask, True = may attend (SDPA convention). True -> float mask of
            ``dtype`` with 0 where allowed and ``finfo(dtype).min`` elsewhere (eager attention).

    Shared text written after image t carries image t to every later token, segments included: put a
    photo's own text right after it, or give the separators after image t segment t. Each query always
    sees itself, so no row is empty (a fully masked row would give NaN in softmax).
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
            raise ValueError(f"mode {mode!r} needs segment_ids of shape (B, T)=({B}, {T}), got {got}")
        group = torch.where(image_ids >= 0, image_ids, segment_ids)  # (B, T); -1 = shared text
        q_g, k_g = group[:, :, None], group[:, None, :]  # (B, T, 1), (B, 1, T)
        allowed = allowed & ((q_g < 0) | (k_g < 0) | (q_g == k_g))
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


def layout_ids(
    input_ids: torch.Tensor, *, image_token_id: int, tokens_per_image: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Image and segment ids (B, T) of NoteVLM sequences, from their runs of `<image>` placeholders.

    The j-th `<image>` token of a row belongs to image ``j // tokens_per_image`` (NoteProcessor writes
    each image as K consecutive placeholders, images in slot order). Text between image s and image
    s + 1 (the separators, and any per-photo text of an interleaved note) is segment s; text before the
    first image and after the last one is shared (-1), so the prompt and the answer of the usual layout
    (all images, then the prompt) see every image in every mode.

    Returns ``(image_ids, segment_ids)``: image ids are -1 on text; segment ids are -1 on images.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    is_img = input_ids == image_token_id  # (B, T)
    count = is_img.long().cumsum(1)  # (B, T) placeholders up to and including t
    image_ids = torch.where(is_img, (count - 1) // tokens_per_image, -1)  # (B, T)
    n_images = count[:, -1:] // tokens_per_image  # (B, 1)
    before = count // tokens_per_image - 1  # (B, T) index of the last image completed at t (-1: none)
    last = before >= n_images - 1  # (B, T) at or after the last image
    segment_ids = torch.where(is_img | (before < 0) | last, -1, before)  # (B, T)
    return image_ids, segment_ids
