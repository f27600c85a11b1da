"""BLIP-2 Q-Former: K learned queries read the image through cross-attention.

Li et al., "BLIP-2: Bootstrapping Language-Image Pre-training with Frozen Image Encoders and
Large Language Models" (2023), Sec. 3.1. Vision features pass a LayerNorm (``ln_vision``); K
learned query embeddings go through ``layers`` blocks of self-attention over the queries,
cross-attention from queries to patches in every ``cross_attention_freq``-th block (layers 0, 2,
... for the BLIP-2 default of 2), and an FFN; a linear projection maps to the LM width.

Deviations: pre-LayerNorm residual blocks (BLIP-2 uses BERT's post-LN) for stable training of
tiny randomly initialised models; no text branch (the ITC/ITG/ITM heads belong to pretraining);
the query width ``dim`` is configurable (BLIP-2: 768).

``scope="note"`` (see :mod:`mm.fusion.base`): the N x K queries of a note (each tagged with its slot)
self-attend across slots and cross-attend to the patches of all the note's real images.
"""

from __future__ import annotations

import torch
from torch import nn

from mm.fusion.base import FusionModule, NoteSlots, check_scope
from mm.fusion.layers import Attention, FeedForward, linear_flops


class QFormerLayer(nn.Module):
    """Self-attention over queries, optional cross-attention to patches, FFN (pre-LN residuals)."""

    def __init__(self, *, dim: int, heads: int, kv_dim: int, cross: bool, mlp_ratio: float):
        super().__init__()
        self.ln_self = nn.LayerNorm(dim)
        self.self_attn = Attention(dim=dim, heads=heads)
        self.cross = cross
        if cross:
            self.ln_cross = nn.LayerNorm(dim)
            self.cross_attn = Attention(dim=dim, heads=heads, kv_dim=kv_dim)
        self.ln_ffn = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim=dim, mlp_ratio=mlp_ratio)

    def forward(
        self,
        q: torch.Tensor,
        patches: torch.Tensor,
        q_mask: torch.Tensor | None = None,
        k_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # q (M, K, D), patches (M, P, D_v); q_mask (M, K), k_mask (M, P) hide padded queries / patches
        h = self.ln_self(q)
        q = q + self.self_attn(h, h, key_mask=q_mask)
        if self.cross:
            q = q + self.cross_attn(self.ln_cross(q), patches, key_mask=k_mask)
        return q + self.ffn(self.ln_ffn(q))  # (M, K, D)

    def flops(self, k: int, p: int) -> int:
        f = self.self_attn.flops(k, k) + self.ffn.flops(k)
        return f + (self.cross_attn.flops(k, p) if self.cross else 0)


class QFormer(FusionModule):
    """K learned queries; self-attn + cross-attn every ``cross_attention_freq`` layers + FFN."""

    kind = "qformer"

    def __init__(
        self,
        *,
        budget: int,
        d_vision: int,
        d_model: int,
        grid: tuple[int, int],
        dim: int | None = None,
        layers: int = 2,
        heads: int = 4,
        cross_attention_freq: int = 2,
        mlp_ratio: float = 4.0,
        scope: str = "image",
        max_images: int = 4,
        budget_per: str = "image",
    ):
        super().__init__(budget=budget, d_vision=d_vision, d_model=d_model, grid=grid)
        check_scope("qformer", scope, budget_per)
        self.scope, self.budget_per = scope, budget_per
        if layers < 1 or cross_attention_freq < 1:
            raise ValueError(
                "qformer needs layers >= 1 and cross_attention_freq >= 1, "
                f"got layers={layers}, cross_attention_freq={cross_attention_freq}"
            )
        dim = d_model if dim is None else dim
        self.dim = dim
        self.ln_vision = nn.LayerNorm(d_vision)
        self.queries = nn.Parameter(torch.randn(budget, dim) * 0.02)  # (K, D)
        self.layers = nn.ModuleList(
            QFormerLayer(
                dim=dim,
                heads=heads,
                kv_dim=d_vision,
                cross=(i % cross_attention_freq == 0),
                mlp_ratio=mlp_ratio,
            )
            for i in range(layers)
        )
        self.ln_out = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, d_model)
        # created last so that scope "image" builds (and draws random numbers) exactly as before
        self.slots = (
            NoteSlots(max_images=max_images, dim=dim, kv_dim=d_vision, per_note=budget_per == "note")
            if scope == "note"
            else None
        )

    def fuse_notes(self, x: torch.Tensor, image_mask: torch.Tensor) -> torch.Tensor:
        # x (B, N, P, D_v) with padded slots zero, image_mask (B, N)
        B, N = x.shape[:2]
        q, kv, q_mask, k_mask = self.slots.flatten(self.queries, self.ln_vision(x), image_mask)
        for layer in self.layers:
            q = layer(q, kv, q_mask, k_mask)  # (B, N*K, D)
        out = self.proj(self.ln_out(q))  # (B, N*K, D_lm)
        return out.reshape(B, -1, self.budget, out.shape[-1])  # (B, S, K, D_lm); S = N or 1

    def flops_per_note(self, images: int) -> int:
        if self.scope == "image":
            return self.flops_per_image() * images
        K, P = self.tokens_per_note(images), self.num_patches * images
        return sum(layer.flops(K, P) for layer in self.layers) + linear_flops(K, self.dim, self.d_model)

    def fuse_images(self, x: torch.Tensor) -> torch.Tensor:
        # x (M, P, D_v)
        x = self.ln_vision(x)
        q = self.queries[None].expand(x.shape[0], -1, -1)  # (M, K, D)
        for layer in self.layers:
            q = layer(q, x)
        return self.proj(self.ln_out(q))  # (M, K, D_lm)

    def flops_per_image(self) -> int:
        K, P = self.budget, self.num_patches
        return sum(layer.flops(K, P) for layer in self.layers) + linear_flops(K, self.dim, self.d_model)
