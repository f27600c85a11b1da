"""LLaVA-1.5 ``mlp2x_gelu`` projector with optional 2D pooling to the token budget.

Liu et al., "Improved Baselines with Visual Instruction Tuning" (LLaVA-1.5, 2023):
``Linear(D_v, D_lm) -> GELU -> Linear(D_lm, D_lm)`` on every patch. LLaVA keeps all P patches;
to honour a budget ``K < P`` we adaptive-average-pool the patch grid to a ``kh x kw = K`` grid
*before* the projector (deviation: LLaVA-OneVision / LLaVA-NeXT pool after it; pooling first
costs P/K times fewer projector FLOPs; it commutes with the first Linear but not with the GELU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from mm.fusion.base import FusionModule
from mm.fusion.layers import factor_grid, linear_flops


class MLPProjector(FusionModule):
    """Patches -> (optional adaptive avg pool to K on the grid) -> Linear, GELU, Linear."""

    kind = "mlp"

    def __init__(self, *, budget: int, d_vision: int, d_model: int, grid: tuple[int, int]):
        super().__init__(budget=budget, d_vision=d_vision, d_model=d_model, grid=grid)
        P = self.num_patches
        if budget > P:
            raise ValueError(
                f"mlp fusion cannot produce K={budget} tokens from P={P} patches (grid {self.grid}); "
                f"choose K <= {P} or a vision tower with more patches"
            )
        pooled = self.grid if budget == P else factor_grid(budget, self.grid, within=True)
        if pooled is None:
            raise ValueError(
                f"mlp fusion pools the {self.grid[0]}x{self.grid[1]} patch grid to a kh x kw grid with "
                f"kh*kw = K, kh <= {self.grid[0]}, kw <= {self.grid[1]}; K={budget} has no such shape. "
                f"Choose K as a product that fits, e.g. {self.grid[0] // 2 * (self.grid[1] // 2) or 1}"
            )
        self.pooled_grid = pooled
        self.fc1 = nn.Linear(d_vision, d_model)
        self.fc2 = nn.Linear(d_model, d_model)

    def fuse_images(self, x: torch.Tensor) -> torch.Tensor:
        # x (M, P, D_v)
        if self.pooled_grid != self.grid:
            h, w = self.grid
            img = rearrange(x, "m (h w) d -> m d h w", h=h, w=w)  # (M, D_v, h, w)
            img = F.adaptive_avg_pool2d(img, self.pooled_grid)  # (M, D_v, kh, kw)
            x = rearrange(img, "m d kh kw -> m (kh kw) d")  # (M, K, D_v)
        return self.fc2(F.gelu(self.fc1(x)))  # (M, K, D_lm)

    def flops_per_image(self) -> int:
        K = self.budget
        return linear_flops(K, self.d_vision, self.d_model) + linear_flops(K, self.d_model, self.d_model)
