"""Building blocks shared by the fusion modules: attention, FFN, 2D sin-cos positions, grid shapes.

Every block also reports its analytic matmul FLOPs (2 x multiply-adds), which
:meth:`mm.fusion.base.FusionModule.describe` sums. Element-wise work (norms, GELU, softmax,
pooling) is not counted, matching ``torch.utils.flop_counter.FlopCounterMode``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn


def linear_flops(tokens: int, d_in: int, d_out: int) -> int:
    """FLOPs of ``tokens`` rows through ``Linear(d_in, d_out)``: 2 * tokens * d_in * d_out."""
    return 2 * tokens * d_in * d_out


class Attention(nn.Module):
    """Multi-head attention with separate q/k/v/o projections (self- or cross-attention).

    ``forward(q_in, kv_in, k_extra=None, key_mask=None)``: ``k_extra`` is added to the keys' input only
    (Qwen-VL adds patch position embeddings to keys, not values); ``key_mask`` (M, L) hides keys (every
    row needs at least one visible key).
    """

    def __init__(self, *, dim: int, heads: int, kv_dim: int | None = None):
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"attention dim {dim} must be divisible by heads {heads}; change dim or heads")
        kv_dim = dim if kv_dim is None else kv_dim
        self.dim, self.heads, self.kv_dim = dim, heads, kv_dim
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(kv_dim, dim)
        self.v = nn.Linear(kv_dim, dim)
        self.o = nn.Linear(dim, dim)

    def forward(
        self,
        q_in: torch.Tensor,
        kv_in: torch.Tensor,
        k_extra: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ):
        # q_in (M, Q, D), kv_in (M, L, D_kv), key_mask (M, L) bool: True = may be attended
        k_in = kv_in if k_extra is None else kv_in + k_extra
        q = rearrange(self.q(q_in), "m q (h d) -> m h q d", h=self.heads)  # (M, H, Q, d)
        k = rearrange(self.k(k_in), "m l (h d) -> m h l d", h=self.heads)  # (M, H, L, d)
        v = rearrange(self.v(kv_in), "m l (h d) -> m h l d", h=self.heads)  # (M, H, L, d)
        mask = None if key_mask is None else key_mask[:, None, None, :]  # (M, 1, 1, L)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (M, H, Q, d)
        return self.o(rearrange(out, "m h q d -> m q (h d)"))  # (M, Q, D)

    def flops(self, q_len: int, kv_len: int) -> int:
        """Projections plus the two attention matmuls (QK^T and AV)."""
        proj = linear_flops(q_len, self.dim, self.dim) * 2 + linear_flops(kv_len, self.kv_dim, self.dim) * 2
        return proj + 2 * (2 * q_len * kv_len * self.dim)


class FeedForward(nn.Module):
    """Linear -> GELU -> Linear with hidden size ``mlp_ratio * dim``."""

    def __init__(self, *, dim: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.hidden = int(dim * mlp_ratio)
        self.dim = dim
        self.net = nn.Sequential(nn.Linear(dim, self.hidden), nn.GELU(), nn.Linear(self.hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def flops(self, tokens: int) -> int:
        return linear_flops(tokens, self.dim, self.hidden) + linear_flops(tokens, self.hidden, self.dim)


def sincos_2d(h: int, w: int, dim: int, *, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2D sin-cos position embedding of an ``h x w`` grid, row-major: (h * w, dim), float32.

    Half the channels encode the row, half the column, each as [sin | cos] over ``dim // 4``
    frequencies (MAE / Qwen-VL ``get_2d_sincos_pos_embed``). ``dim`` must be divisible by 4.
    """
    if dim % 4 != 0:
        raise ValueError(f"2D sin-cos embedding needs dim divisible by 4, got {dim}; choose another dim")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # (dim/4,)
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij"
    )
    out_y = ys.reshape(-1, 1) * omega[None]  # (h*w, dim/4)
    out_x = xs.reshape(-1, 1) * omega[None]  # (h*w, dim/4)
    emb = torch.cat([out_y.sin(), out_y.cos(), out_x.sin(), out_x.cos()], dim=1)  # (h*w, dim)
    return emb.float()


def factor_grid(k: int, grid: tuple[int, int], *, within: bool) -> tuple[int, int] | None:
    """The ``(kh, kw)`` with ``kh * kw == k`` whose aspect ratio is closest to ``grid``'s.

    With ``within=True`` only shapes with ``kh <= h`` and ``kw <= w`` qualify (pooling cannot
    create patches). Returns None when no shape qualifies.
    """
    h, w = grid
    best, best_cost = None, math.inf
    for kh in range(1, k + 1):
        if k % kh:
            continue
        kw = k // kh
        if within and (kh > h or kw > w):
            continue
        cost = abs(math.log(kh / kw) - math.log(h / w))
        if cost < best_cost - 1e-12:
            best, best_cost = (kh, kw), cost
    return best
