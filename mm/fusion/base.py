"""The interface every fusion module shares: masked per-image application and ``describe()``.

A fusion module maps each image's patches ``(P, D_v)`` to exactly ``K`` LM-space tokens
``(K, D_lm)``. Subclasses implement :meth:`FusionModule.fuse_images` on the real images only;
:meth:`FusionModule.forward` gathers the real image slots, fuses them and scatters the result into
zeros. So a padded slot gets output zero and token-mask False, is never attended to, and receives
exactly zero gradient; and since images are fused independently, permuting a note's images
permutes the outputs.
"""

from __future__ import annotations

import torch
from torch import nn


class FusionModule(nn.Module):
    """Base class: ``forward(patches (B, N, P, D_v), image_mask (B, N)) -> (B, N, K, D_lm), (B, N, K)``."""

    kind: str = ""

    def __init__(self, *, budget: int, d_vision: int, d_model: int, grid: tuple[int, int]):
        super().__init__()
        if budget < 1:
            raise ValueError(f"token budget K must be >= 1, got {budget}")
        if len(grid) != 2 or min(grid) < 1:
            raise ValueError(f"grid must be (h, w) with h, w >= 1, got {grid}")
        self.budget = int(budget)
        self.d_vision = int(d_vision)
        self.d_model = int(d_model)
        self.grid = (int(grid[0]), int(grid[1]))
        self.num_patches = self.grid[0] * self.grid[1]

    def fuse_images(self, x: torch.Tensor) -> torch.Tensor:
        """(M, P, D_v) patches of M real images -> (M, K, D_lm) tokens."""
        raise NotImplementedError

    def flops_per_image(self) -> int:
        """Analytic matmul FLOPs (2 x multiply-adds) to fuse one image."""
        raise NotImplementedError

    def forward(
        self, patches: torch.Tensor, image_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if patches.dim() != 4:
            raise ValueError(f"patches must be (B, N_img, P, D_v), got shape {tuple(patches.shape)}")
        B, N, P, D = patches.shape
        if P != self.num_patches or D != self.d_vision:
            raise ValueError(
                f"{self.kind} fusion was built for P={self.num_patches} patches (grid {self.grid}) of "
                f"dim {self.d_vision}, got P={P}, D_v={D}; build it with the vision tower's grid and dim"
            )
        if image_mask is None:
            image_mask = torch.ones(B, N, dtype=torch.bool, device=patches.device)
        if image_mask.shape != (B, N):
            raise ValueError(f"image_mask must be (B, N_img)=({B}, {N}), got {tuple(image_mask.shape)}")
        image_mask = image_mask.to(torch.bool)
        out = patches.new_zeros(B, N, self.budget, self.d_model)  # (B, N, K, D_lm)
        if bool(image_mask.any()):
            real = patches[image_mask]  # (M, P, D_v): only real slots, so padded ones get no gradient
            fused = self.fuse_images(real)  # (M, K, D_lm)
            out = out.index_put((image_mask,), fused.to(out.dtype))
        token_mask = image_mask[:, :, None].expand(B, N, self.budget).clone()  # (B, N, K)
        return out, token_mask

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def describe(self, images_per_note: int = 1) -> dict:
        """Parameters, tokens and analytic FLOPs for a note with ``images_per_note`` images."""
        per_image = self.flops_per_image()
        return {
            "kind": self.kind,
            "params": self.num_parameters(),
            "tokens_per_image": self.budget,
            "tokens_per_note": self.budget * images_per_note,
            "flops_per_image": per_image,
            "flops_per_note": per_image * images_per_note,
        }
