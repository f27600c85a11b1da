"""The interface every fusion module shares: masked per-image application and ``describe()``.

A fusion module maps each image's patches ``(P, D_v)`` to exactly ``K`` LM-space tokens
``(K, D_lm)``. Subclasses implement :meth:`FusionModule.fuse_images` on the real images only;
:meth:`FusionModule.forward` gathers the real image slots, fuses them and scatters the result into
zeros. So a padded slot gets output zero and token-mask False, is never attended to, and receives
exactly zero gradient; and since images are fused independently, permuting a note's images
permutes the outputs.

Scope ``"note"`` (qformer and resampler): the K queries of every image slot attend over the patches of
*all* the note's real images at once (:meth:`FusionModule.fuse_notes`), with a learned slot embedding on
the queries and on each image's patches, so a note's N x K tokens can split the work across photos
(a repeated object need not be encoded N times). Still K tokens per image slot; padded slots are
zeroed before fusion, hidden from every attention and zeroed after it, so they get zero output and zero
gradient. Permuting images no longer permutes outputs exactly (slot embeddings tag positions).

Budget per note (``budget_per="note"``, scope "note" only): one set of K queries per *note* (no query slot
embedding) reads the slot-tagged patches of all the note's real images and yields K tokens for the whole
note, whatever its photo count: output (B, 1, K, D_lm), token mask (B, 1, K) True where the note has an
image. A 4-photo note then costs K tokens instead of 4 x K; a 1-photo note costs K too. Padded slots are
still zeroed before fusion and hidden from attention, so they change nothing and get zero gradient.
"""

from __future__ import annotations

import torch
from einops import repeat
from torch import nn

FUSION_SCOPES = ("image", "note")
BUDGETS_PER = ("image", "note")
"""What the token budget K counts: tokens per image slot, or tokens per note (scope "note" only)."""


def check_scope(kind: str, scope: str, budget_per: str) -> None:
    """ValueError unless ``scope`` and ``budget_per`` are known and compatible."""
    if scope not in FUSION_SCOPES:
        raise ValueError(f"{kind} scope must be one of {FUSION_SCOPES}, got {scope!r}")
    if budget_per not in BUDGETS_PER:
        raise ValueError(f"{kind} budget_per must be one of {BUDGETS_PER}, got {budget_per!r}")
    if budget_per == "note" and scope != "note":
        raise ValueError(
            f"{kind}: budget_per 'note' needs scope 'note' (per-image queries cannot share a note's budget); "
            "set scope: note or budget_per: image"
        )


class FusionModule(nn.Module):
    """Base class: ``forward(patches (B, N, P, D_v), image_mask (B, N)) -> (B, N, K, D_lm), (B, N, K)``."""

    kind: str = ""
    scope: str = "image"
    budget_per: str = "image"

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

    def output_slots(self, images: int) -> int:
        """Token groups of K in the output of a note with ``images`` slots: ``images``, or 1 per note."""
        return 1 if self.budget_per == "note" else images

    def tokens_per_note(self, images: int) -> int:
        """LM tokens a note with ``images`` real images costs."""
        return self.budget * self.output_slots(images)

    def fuse_notes(self, x: torch.Tensor, image_mask: torch.Tensor) -> torch.Tensor:
        """Scope "note": (B, N, P, D_v) patches (padded slots zero), (B, N) mask -> (B, S, K, D_lm) with
        S = N (budget per image) or 1 (budget per note)."""
        raise NotImplementedError(f"{self.kind} fusion has no note scope")

    def flops_per_note(self, images: int) -> int:
        """Analytic matmul FLOPs to fuse a note of ``images`` images (per image x images by default)."""
        return self.flops_per_image() * images

    def flops_per_image(self) -> int:
        """Analytic matmul FLOPs (2 x multiply-adds) to fuse one image."""
        raise NotImplementedError

    def forward(
        self, patches: torch.Tensor, image_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, N, P, D_v) patches, (B, N) slot mask -> tokens (B, S, K, D_lm) and token mask (B, S, K);
        S = N, or 1 under budget_per "note"."""
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
        if self.scope == "note":
            keep = image_mask[:, :, None, None]  # (B, N, 1, 1)
            x = torch.where(keep, patches, torch.zeros((), dtype=patches.dtype, device=patches.device))
            fused = self.fuse_notes(x, image_mask)  # (B, S, K, D_lm)
            per_note = self.budget_per == "note"
            slot_mask = image_mask.any(1, keepdim=True) if per_note else image_mask  # (B, S)
            zero = torch.zeros((), dtype=fused.dtype, device=fused.device)
            out = torch.where(slot_mask[:, :, None, None], fused, zero)  # (B, S, K, D_lm)
            return out, slot_mask[:, :, None].expand(*slot_mask.shape, self.budget).clone()
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
            "scope": self.scope,
            "budget_per": self.budget_per,
            "params": self.num_parameters(),
            "tokens_per_image": self.tokens_per_note(images_per_note) / images_per_note
            if self.budget_per == "note"
            else self.budget,
            "tokens_per_note": self.tokens_per_note(images_per_note),
            "flops_per_image": per_image,
            "flops_per_note": self.flops_per_note(images_per_note),
        }


class NoteSlots(nn.Module):
    """Scope "note" helpers: slot embeddings on queries and patches, flattening and key masks.

    ``per_note``: one set of K queries per note (budget_per "note"), so no query slot embedding.
    """

    def __init__(self, *, max_images: int, dim: int, kv_dim: int, per_note: bool = False):
        super().__init__()
        if max_images < 1:
            raise ValueError(f"note-scope fusion needs max_images >= 1, got {max_images}")
        self.max_images = max_images
        self.per_note = per_note
        # (N_max, D); None under per_note (a parameter that gets no gradient would trouble DDP)
        self.query_slot = None if per_note else nn.Parameter(torch.randn(max_images, dim) * 0.02)
        self.patch_slot = nn.Parameter(torch.randn(max_images, kv_dim) * 0.02)  # (N_max, D_kv)

    def flatten(
        self, queries: torch.Tensor, x: torch.Tensor, image_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """queries (K, D), x (B, N, P, D_kv), image_mask (B, N) -> the note's flat queries (B, S*K, D),
        slot-tagged patches (B, N*P, D_kv), query mask (B, S*K) and key mask (B, N*P); S = N, or 1 when
        ``per_note``."""
        B, N, P, _ = x.shape
        K = queries.shape[0]
        if N > self.max_images:
            raise ValueError(
                f"note-scope fusion was built for max_images={self.max_images}, got {N} image slots; "
                "build it with the model's max_images"
            )
        kv = (x + self.patch_slot[:N, None][None].to(x.dtype)).flatten(1, 2)  # (B, N*P, D_kv)
        # a note without images keeps all keys visible (its outputs are zeroed) so no row is all-masked
        real = image_mask | ~image_mask.any(dim=1, keepdim=True)  # (B, N)
        k_mask = repeat(real, "b n -> b (n p)", p=P)  # (B, N*P)
        if self.query_slot is None:  # per note: K queries read all N photos
            q = repeat(queries, "k d -> b k d", b=B)  # (B, K, D)
            return q, kv, torch.ones(B, K, dtype=torch.bool, device=x.device), k_mask
        q = queries[None, None] + self.query_slot[:N, None][None]  # (1, N, K, D)
        q = repeat(q, "1 n k d -> b (n k) d", b=B)  # (B, N*K, D)
        q_mask = repeat(real, "b n -> b (n k)", k=K)  # (B, N*K)
        return q, kv, q_mask, k_mask
