"""Perceiver / Qwen-VL-style resampler: K learned queries cross-attend to position-tagged patches.

Alayrac et al., "Flamingo" (2022), Perceiver Resampler; Bai et al., "Qwen-VL" (2023), Sec. 2.1
"Position-aware Vision-Language Adapter": a single cross-attention layer whose K queries and
patch keys both carry fixed 2D sin-cos position embeddings (queries on a kh x kw grid, patches on
the h x w patch grid), added to keys but not values.

This module: ``kv_proj`` (D_v -> dim, as Qwen-VL), LayerNorms on queries and patches, then
``layers`` Perceiver blocks (cross-attention to patches + FFN, pre-LN residuals), a final
LayerNorm and a projection to the LM width. Deviations: Qwen-VL uses one layer and no FFN
(``layers=1`` gets close); Flamingo also lets latents attend to themselves by concatenating them
to the keys, which we omit so every query reads only the image.

``scope="note"`` (see :mod:`mm.fusion.base`): the N x K latents of a note (each tagged with its slot)
cross-attend to the patches of all the note's real images (each image's patches tagged with its slot).
"""

from __future__ import annotations

import torch
from torch import nn

from mm.fusion.base import FusionModule, NoteSlots, check_scope
from mm.fusion.layers import Attention, FeedForward, factor_grid, linear_flops, sincos_2d


class ResamplerLayer(nn.Module):
    """Cross-attention from latents to patches (keys carry positions) + FFN, pre-LN residuals."""

    def __init__(self, *, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.ln_q = nn.LayerNorm(dim)
        self.ln_kv = nn.LayerNorm(dim)
        self.attn = Attention(dim=dim, heads=heads)
        self.ln_ffn = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim=dim, mlp_ratio=mlp_ratio)

    def forward(
        self,
        lat: torch.Tensor,
        q_pos: torch.Tensor,
        x: torch.Tensor,
        k_pos: torch.Tensor,
        k_mask: torch.Tensor | None = None,
    ):
        # lat (M, K, D), q_pos (K, D), x (M, P, D), k_pos (P, D), k_mask (M, P) hides padded patches
        lat = lat + self.attn(self.ln_q(lat) + q_pos, self.ln_kv(x), k_extra=k_pos, key_mask=k_mask)
        return lat + self.ffn(self.ln_ffn(lat))  # (M, K, D)

    def flops(self, k: int, p: int) -> int:
        return self.attn.flops(k, p) + self.ffn.flops(k)


class Resampler(FusionModule):
    """K learned queries (+2D sin-cos) cross-attend to patches (+2D sin-cos), ``layers`` times."""

    kind = "resampler"

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
        mlp_ratio: float = 4.0,
        scope: str = "image",
        max_images: int = 4,
        budget_per: str = "image",
    ):
        super().__init__(budget=budget, d_vision=d_vision, d_model=d_model, grid=grid)
        check_scope("resampler", scope, budget_per)
        self.scope, self.budget_per = scope, budget_per
        if layers < 1:
            raise ValueError(f"resampler needs layers >= 1, got {layers}")
        dim = d_model if dim is None else dim
        self.dim = dim
        self.query_grid = factor_grid(budget, self.grid, within=False)
        self.kv_proj = nn.Linear(d_vision, dim)
        self.queries = nn.Parameter(torch.randn(budget, dim) * 0.02)  # (K, D)
        # Fixed positions are computed on demand (no buffers: nothing to save, nothing left
        # uninitialised when transformers builds the model on the meta device).
        self._pos_cache: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self.layers = nn.ModuleList(
            ResamplerLayer(dim=dim, heads=heads, mlp_ratio=mlp_ratio) for _ in range(layers)
        )
        self.ln_out = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, d_model)
        # created last so that scope "image" builds (and draws random numbers) exactly as before
        self.slots = (
            NoteSlots(max_images=max_images, dim=dim, kv_dim=dim, per_note=budget_per == "note")
            if scope == "note"
            else None
        )

    def fuse_notes(self, x: torch.Tensor, image_mask: torch.Tensor) -> torch.Tensor:
        # x (B, N, P, D_v) with padded slots zero, image_mask (B, N)
        B, N = x.shape[:2]
        x = self.kv_proj(x)  # (B, N, P, D)
        lat, kv, _, k_mask = self.slots.flatten(self.queries, x, image_mask)  # (B, N*K, D), (B, N*P, D)
        q_pos, k_pos = self.positions(x.device, x.dtype)  # (K, D), (P, D)
        q_pos, k_pos = q_pos.repeat(self.output_slots(N), 1), k_pos.repeat(N, 1)  # (S*K, D), (N*P, D)
        for layer in self.layers:
            lat = layer(lat, q_pos, kv, k_pos, k_mask)
        out = self.proj(self.ln_out(lat))  # (B, N*K, D_lm)
        return out.reshape(B, -1, self.budget, out.shape[-1])  # (B, S, K, D_lm); S = N or 1

    def flops_per_note(self, images: int) -> int:
        if self.scope == "image":
            return self.flops_per_image() * images
        K, P = self.tokens_per_note(images), self.num_patches * images
        f = linear_flops(P, self.d_vision, self.dim) + linear_flops(K, self.dim, self.d_model)
        return f + sum(layer.flops(K, P) for layer in self.layers)

    def fuse_images(self, x: torch.Tensor) -> torch.Tensor:
        # x (M, P, D_v)
        x = self.kv_proj(x)  # (M, P, D)
        lat = self.queries[None].expand(x.shape[0], -1, -1)  # (M, K, D)
        q_pos, k_pos = self.positions(x.device, x.dtype)  # (K, D), (P, D)
        for layer in self.layers:
            lat = layer(lat, q_pos, x, k_pos)
        return self.proj(self.ln_out(lat))  # (M, K, D_lm)

    def positions(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """2D sin-cos embeddings of the query grid (K, D) and of the patch grid (P, D)."""
        key = (device, dtype)
        if key not in self._pos_cache:
            q_pos = sincos_2d(*self.query_grid, self.dim).to(device=device, dtype=dtype)
            k_pos = sincos_2d(*self.grid, self.dim).to(device=device, dtype=dtype)
            self._pos_cache[key] = (q_pos, k_pos)
        return self._pos_cache[key]

    def flops_per_image(self) -> int:
        K, P = self.budget, self.num_patches
        f = linear_flops(P, self.d_vision, self.dim) + linear_flops(K, self.dim, self.d_model)
        return f + sum(layer.flops(K, P) for layer in self.layers)
