"""Fusion modules: image patches -> exactly K LM tokens per image (or per note), behind one interface.

    fusion = build_fusion("qformer", budget=16, d_vision=64, d_model=128, grid=(8, 8), layers=2)
    tokens, token_mask = fusion(patches, image_mask)  # (B, N, P, D_v), (B, N) -> (B, N, K, D), (B, N, K)
    fusion.describe(images_per_note=4)

Kinds: ``mlp`` (LLaVA mlp2x_gelu + optional grid pooling), ``qformer`` (BLIP-2),
``resampler`` (Perceiver / Qwen-VL with 2D positions). See each module for the paper and deviations.
Scope ``note`` and ``budget_per: note`` (qformer, resampler; :mod:`mm.fusion.base`): K tokens per note.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mm.fusion.base import BUDGETS_PER, FUSION_SCOPES, FusionModule
from mm.fusion.mlp import MLPProjector
from mm.fusion.qformer import QFormer
from mm.fusion.resampler import Resampler

_REGISTRY: dict[str, type[FusionModule]] = {"mlp": MLPProjector, "qformer": QFormer, "resampler": Resampler}
FUSION_KINDS: tuple[str, ...] = tuple(_REGISTRY)


@dataclass
class FusionConfig:
    """Which fusion module to build and its size; the vision/LM dims come from the model."""

    kind: str = "qformer"
    """One of FUSION_KINDS: "mlp", "qformer", "resampler"."""
    budget: int = 16
    """K, the number of LM tokens each image becomes (each note, under budget_per "note")."""
    dim: int | None = None
    """Internal width of qformer/resampler queries; None = the LM width. Ignored by mlp."""
    layers: int = 2
    """Transformer blocks of qformer/resampler. Ignored by mlp."""
    heads: int = 4
    """Attention heads of qformer/resampler. Ignored by mlp."""
    cross_attention_freq: int = 2
    """qformer: cross-attention in every n-th block (BLIP-2 uses 2). Ignored by the others."""
    mlp_ratio: float = 4.0
    """FFN hidden size / width in qformer/resampler blocks. Ignored by mlp."""
    scope: str = "image"
    """qformer/resampler: "image" (each image's K queries read that image) or "note" (every slot's K
    queries read all the note's images, with slot embeddings). mlp supports "image" only."""
    budget_per: str = "image"
    """What K counts: "image" (K tokens per image slot: N x K per note) or "note" (scope "note" only: one
    set of K queries reads every photo, so every note costs K tokens whatever its photo count)."""

    def __post_init__(self) -> None:
        if self.kind not in _REGISTRY:
            raise ValueError(f"unknown fusion kind {self.kind!r}; known kinds: {', '.join(FUSION_KINDS)}")
        if self.scope not in FUSION_SCOPES:
            raise ValueError(f"fusion scope must be one of {FUSION_SCOPES}, got {self.scope!r}")
        if self.scope == "note" and self.kind == "mlp":
            raise ValueError(
                "fusion scope 'note' needs kind qformer or resampler (mlp maps each patch on its own)"
            )
        if self.budget_per not in BUDGETS_PER:
            raise ValueError(f"fusion budget_per must be one of {BUDGETS_PER}, got {self.budget_per!r}")
        if self.budget_per == "note" and self.scope != "note":
            raise ValueError(
                "fusion budget_per 'note' needs scope 'note' (a note's K tokens read all its photos); "
                "set scope: note, or budget_per: image"
            )
        if self.budget < 1:
            raise ValueError(f"fusion budget must be >= 1, got {self.budget}")

    def kind_kwargs(self) -> dict[str, Any]:
        """The keyword arguments that apply to ``self.kind``."""
        if self.kind == "mlp":
            return {}
        kw: dict[str, Any] = {
            "dim": self.dim,
            "layers": self.layers,
            "heads": self.heads,
            "mlp_ratio": self.mlp_ratio,
        }
        if self.kind == "qformer":
            kw["cross_attention_freq"] = self.cross_attention_freq
        if self.scope != "image":  # only when set, so per-image configs and checkpoints read as before
            kw["scope"] = self.scope
        if self.budget_per != "image":
            kw["budget_per"] = self.budget_per
        return kw


def build_fusion(
    kind: str, *, budget: int, d_vision: int, d_model: int, grid: tuple[int, int], **kind_kwargs: Any
) -> FusionModule:
    """Build the fusion module ``kind``; unknown kinds raise ``ValueError`` naming the known ones."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown fusion kind {kind!r}; known kinds: {', '.join(FUSION_KINDS)}")
    cls = _REGISTRY[kind]
    try:
        return cls(budget=budget, d_vision=d_vision, d_model=d_model, grid=tuple(grid), **kind_kwargs)
    except TypeError as e:
        raise ValueError(f"bad arguments for fusion kind {kind!r}: {e}") from e


def build_fusion_from_config(
    cfg: FusionConfig, *, d_vision: int, d_model: int, grid: tuple[int, int]
) -> FusionModule:
    """``build_fusion`` driven by a :class:`FusionConfig`."""
    return build_fusion(
        cfg.kind, budget=cfg.budget, d_vision=d_vision, d_model=d_model, grid=grid, **cfg.kind_kwargs()
    )


def describe_kinds(
    *,
    budget: int,
    d_vision: int,
    d_model: int,
    grid: tuple[int, int],
    images_per_note: int = 1,
    kind_kwargs: dict[str, dict[str, Any]] | None = None,
) -> list[dict]:
    """``describe()`` of every kind built at the same budget K: the rows of a fair comparison table.

    ``kind_kwargs`` maps a kind to its extra build arguments (e.g. ``{"qformer": {"layers": 4}}``).
    """
    kind_kwargs = kind_kwargs or {}
    unknown = sorted(set(kind_kwargs) - set(FUSION_KINDS))
    if unknown:
        raise ValueError(f"kind_kwargs names unknown kinds {unknown}; known kinds: {', '.join(FUSION_KINDS)}")
    rows = []
    for kind in FUSION_KINDS:
        f = build_fusion(
            kind, budget=budget, d_vision=d_vision, d_model=d_model, grid=grid, **kind_kwargs.get(kind, {})
        )
        rows.append(f.describe(images_per_note=images_per_note))
    return rows


__all__ = [
    "BUDGETS_PER",
    "FUSION_KINDS",
    "FUSION_SCOPES",
    "FusionConfig",
    "FusionModule",
    "MLPProjector",
    "QFormer",
    "Resampler",
    "build_fusion",
    "build_fusion_from_config",
    "describe_kinds",
]
