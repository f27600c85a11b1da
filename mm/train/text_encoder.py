"""A tiny transformer text encoder for contrastive pretraining (CLIP's text tower, scaled down).

Token + learned position embeddings -> ``layers`` pre-norm transformer encoder blocks (bidirectional,
padding masked out) -> final LayerNorm -> pooled vector. ``layers: 0`` is a bag of embeddings (no
attention): enough when texts are templated lists of words, and ~40x cheaper than one block.
``conv_kernel: k`` adds one residual 1-D convolution over neighbouring tokens (kernel k, GELU) before the
blocks, so even a bag of embeddings binds a word to its neighbours ("orange bicycle" vs "orange helmet");
deviation from CLIP, which has no convolution.
Pooling ``mean`` averages the non-pad tokens;
``eos`` takes the last non-pad token (CLIP takes the EOT token; deviation: no causal mask, so ``eos``
still sees the whole text).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

TEXT_POOLINGS = ("mean", "eos")


@dataclass
class TextEncoderConfig:
    """Size of the text tower; the vocabulary comes from the tokenizer."""

    width: int = 128
    """Hidden size of the token embeddings and transformer blocks."""
    layers: int = 2
    """Number of transformer encoder blocks (0 = pooled token + position embeddings, no attention)."""
    heads: int = 4
    """Attention heads per block (must divide width)."""
    mlp_ratio: float = 4.0
    """FFN hidden size / width."""
    max_len: int = 64
    """Most tokens per text; longer texts are truncated by the tokenizer call."""
    pooling: str = "mean"
    """How to pool tokens into one vector: "mean" (non-pad tokens) or "eos" (last non-pad token)."""
    dropout: float = 0.0
    """Dropout inside the blocks."""
    conv_kernel: int = 0
    """Width of a residual token convolution before the blocks (0 = none; odd, e.g. 3)."""

    def __post_init__(self) -> None:
        if self.pooling not in TEXT_POOLINGS:
            raise ValueError(f"text pooling must be one of {TEXT_POOLINGS}, got {self.pooling!r}")
        if self.width % self.heads:
            raise ValueError(f"text width {self.width} must be divisible by heads {self.heads}")
        if self.layers == 0 and self.pooling != "mean":
            raise ValueError("text layers: 0 (bag of embeddings) needs pooling 'mean'; 'eos' keeps one token")
        if self.conv_kernel < 0 or (self.conv_kernel and self.conv_kernel % 2 == 0):
            raise ValueError(f"text conv_kernel must be 0 (off) or odd (e.g. 3), got {self.conv_kernel}")
        if self.layers < 0 or self.max_len < 2:
            raise ValueError(f"need layers >= 0 and max_len >= 2, got {self.layers}, {self.max_len}")


class TextEncoder(nn.Module):
    """``forward(input_ids (B, T), attention_mask (B, T)) -> (B, width)``."""

    def __init__(self, *, cfg: TextEncoderConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(vocab_size, cfg.width)
        self.pos = nn.Parameter(torch.randn(cfg.max_len, cfg.width) * 0.01)
        block = nn.TransformerEncoderLayer(
            d_model=cfg.width,
            nhead=cfg.heads,
            dim_feedforward=int(cfg.width * cfg.mlp_ratio),
            dropout=cfg.dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = (
            nn.TransformerEncoder(block, num_layers=cfg.layers, enable_nested_tensor=False)
            if cfg.layers
            else None
        )
        self.conv = (
            nn.Conv1d(cfg.width, cfg.width, cfg.conv_kernel, padding=cfg.conv_kernel // 2)
            if cfg.conv_kernel
            else None
        )
        self.norm = nn.LayerNorm(cfg.width)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        B, T = input_ids.shape
        if T > self.cfg.max_len:
            raise ValueError(
                f"text of {T} tokens exceeds max_len={self.cfg.max_len}; truncate when tokenizing"
            )
        mask = attention_mask.to(torch.bool)  # (B, T)
        x = self.tok(input_ids) + self.pos[:T]  # (B, T, W)
        if self.conv is not None:
            h = (x * mask[..., None].to(x.dtype)).transpose(1, 2)  # (B, W, T), pads zeroed
            x = x + nn.functional.gelu(self.conv(h)).transpose(1, 2)  # (B, T, W)
        if self.blocks is not None:
            x = self.blocks(x, src_key_padding_mask=~mask)  # (B, T, W)
        x = self.norm(x)
        if self.cfg.pooling == "mean":
            m = mask[..., None].to(x.dtype)  # (B, T, 1)
            return (x * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, W)
        last = mask.long().sum(1).clamp(min=1) - 1  # (B,)
        return x[torch.arange(B, device=x.device), last]  # (B, W)
