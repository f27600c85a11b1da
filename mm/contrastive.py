"""Contrastive image-text losses as pure functions: CLIP InfoNCE, SigLIP, multi-positive, cross-rank gather.

Symmetric InfoNCE follows CLIP (Radford et al. 2021, "Learning Transferable Visual Models From Natural
Language Supervision", Fig. 3): ``logits = scale * note @ text.T`` with ``scale = exp(log_scale)``,
``log_scale`` learnable, initialised to ln(1/0.07) and clamped to <= ln(100) after every optimizer step.
The sigmoid loss follows SigLIP (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training", Alg. 1):
``-sum log sigmoid(z_ij * (scale * x_i . y_j + bias)) / B`` with ``z_ij = +1`` on positives, -1 elsewhere.

Deviations / additions, all opt-in:

* ``label_smoothing``: targets ``(1 - eps) * onehot + eps / C`` over the C valid columns (what
  ``F.cross_entropy(label_smoothing=eps)`` does when every column is valid).
* multi-positive: notes carry several images; every valid image of note ``b`` is a positive for text ``b``.
  Text->image targets are uniform over the note's valid images (soft targets, as in UniCL, Yang et al.
  2022); image->text rows are ordinary one-positive rows. Padded image slots are neither rows nor columns.
  With one image per note this is exactly :func:`clip_loss`.

Features are expected L2-normalised (the functions do not normalise). Every function here is pure; the
distributed helpers only add collectives (:func:`gather_with_grad`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

MAX_LOG_SCALE = math.log(100.0)
"""Upper bound on the learnable log logit scale (CLIP clamps the scale to 100)."""


def init_logit_scale(temperature: float = 0.07) -> float:
    """Initial value of the learnable *log* logit scale: ln(1 / temperature) (CLIP: ln(1/0.07))."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return math.log(1.0 / temperature)


def init_logit_bias() -> float:
    """SigLIP's initial logit bias (-10; paper Sec. 3.2, with log scale ln 10)."""
    return -10.0


@torch.no_grad()
def clamp_logit_scale_(log_scale: Tensor, max_log_scale: float = MAX_LOG_SCALE) -> Tensor:
    """Clamp a learnable log logit scale in place to ``<= max_log_scale``; call after each optimizer step."""
    return log_scale.clamp_(max=max_log_scale)


def param_groups(
    model: torch.nn.Module,
    *,
    weight_decay: float,
    no_decay_names: tuple[str, ...] = ("log_scale", "logit_bias"),
) -> list[dict]:
    """Two AdamW parameter groups: decayed weights, and no-decay for the temperature, bias and norm params.

    A parameter is exempt from weight decay when its name ends with one of ``no_decay_names`` or it has
    fewer than 2 dimensions (biases, LayerNorm gains, the logit scale), as CLIP/open_clip do.
    Frozen parameters (``requires_grad=False``) are left out.
    """
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or any(name.endswith(n) for n in no_decay_names):
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def soft_cross_entropy(logits: Tensor, targets: Tensor, row_mask: Tensor | None = None) -> Tensor:
    """Mean over (valid) rows of ``-sum_j targets_ij * log_softmax(logits)_ij``.

    ``logits`` and ``targets``: (R, C); masked-out columns must already be -inf in ``logits`` and 0 in
    ``targets``. ``row_mask``: (R,) bool, rows to average over (default all).
    """
    logp = torch.log_softmax(logits, dim=-1)  # (R, C)
    per_row = -(targets * logp.masked_fill(targets == 0, 0.0)).sum(-1)  # (R,)
    if row_mask is None:
        return per_row.mean()
    return per_row[row_mask].mean()


def _smooth(targets: Tensor, col_mask: Tensor, eps: float) -> Tensor:
    """(1 - eps) * targets + eps / C_valid on valid columns; targets (R, C), col_mask (C,) bool."""
    if eps == 0.0:
        return targets
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {eps}")
    n_valid = col_mask.sum().clamp(min=1)
    return (1.0 - eps) * targets + eps * col_mask.to(targets.dtype) / n_valid


def clip_logits(note: Tensor, text: Tensor, scale: Tensor | float) -> Tensor:
    """``scale * note @ text.T``: (B, D), (B, D) -> (B, B), rows are notes."""
    return scale * note @ text.T


def clip_loss(note: Tensor, text: Tensor, scale: Tensor | float, *, label_smoothing: float = 0.0) -> Tensor:
    """Symmetric InfoNCE (CLIP): mean of note->text and text->note cross-entropy; ``note`` row b pairs text b.

    ``note``, ``text``: (B, D) L2-normalised. ``scale`` is the logit scale itself (``exp(log_scale)`` or
    ``1 / temperature`` for a fixed temperature). Equals ``open_clip.loss.ClipLoss`` when
    ``label_smoothing == 0``. At init with random features the loss is about ln B.
    """
    _check_pair(note, text)
    logits = clip_logits(note, text, scale)  # (B, B)
    labels = torch.arange(logits.shape[0], device=logits.device)
    return 0.5 * (
        F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
        + F.cross_entropy(logits.T, labels, label_smoothing=label_smoothing)
    )


def multi_positive_clip_loss(
    images: Tensor,
    image_mask: Tensor,
    text: Tensor,
    scale: Tensor | float,
    *,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Symmetric InfoNCE where every valid image of note b is a positive for text b.

    ``images``: (B, N, D) per-image embeddings, ``image_mask``: (B, N) bool (True = real image),
    ``text``: (B, D). Padded slots get no logits, no targets and therefore zero gradient.
    """
    B, N, D = images.shape
    if image_mask.shape != (B, N):
        raise ValueError(f"image_mask must be (B, N) = {(B, N)}, got {tuple(image_mask.shape)}")
    if text.shape != (B, D):
        raise ValueError(f"text must be (B, D) = {(B, D)}, got {tuple(text.shape)}")
    if not bool(image_mask.any(dim=1).all()):
        raise ValueError("every note needs at least one valid image (image_mask has an all-False row)")
    flat = images.reshape(B * N, D)  # (B*N, D)
    valid = image_mask.reshape(B * N)  # (B*N,)
    owner = torch.arange(B, device=images.device).repeat_interleave(N)  # (B*N,)
    pos = (owner[None, :] == torch.arange(B, device=images.device)[:, None]) & valid[None, :]  # (B, B*N)
    pos_f = pos.to(images.dtype)

    # text -> image: soft targets uniform over the note's valid images
    t2i_logits = (scale * text @ flat.T).masked_fill(~valid[None, :], float("-inf"))  # (B, B*N)
    t2i_targets = _smooth(pos_f / pos_f.sum(1, keepdim=True), valid, label_smoothing)
    t2i = soft_cross_entropy(t2i_logits, t2i_targets)

    # image -> text: one positive per valid image row
    i2t_logits = scale * flat @ text.T  # (B*N, B)
    all_cols = torch.ones(B, dtype=torch.bool, device=images.device)
    i2t_targets = _smooth(pos_f.T, all_cols, label_smoothing)  # (B*N, B)
    i2t = soft_cross_entropy(i2t_logits, i2t_targets, row_mask=valid)
    return 0.5 * (t2i + i2t)


def siglip_loss(
    note: Tensor,
    text: Tensor,
    scale: Tensor | float,
    bias: Tensor | float,
    *,
    positive_mask: Tensor | None = None,
) -> Tensor:
    """SigLIP pairwise sigmoid loss: ``-sum_ij log sigmoid(z_ij (scale x_i.y_j + bias)) / R``.

    ``note``: (R, D) rows (notes, or flattened valid images), ``text``: (C, D). ``positive_mask`` (R, C)
    bool, default the identity (R == C). Equals ``open_clip.loss.SigLipLoss`` on one rank.
    """
    if note.ndim != 2 or text.ndim != 2 or note.shape[1] != text.shape[1]:
        raise ValueError(
            f"expected note (R, D) and text (C, D), got {tuple(note.shape)}, {tuple(text.shape)}"
        )
    logits = scale * note @ text.T + bias  # (R, C)
    if positive_mask is None:
        _check_pair(note, text)
        positive_mask = torch.eye(note.shape[0], dtype=torch.bool, device=note.device)
    z = positive_mask.to(logits.dtype) * 2.0 - 1.0  # (R, C) in {-1, +1}
    return -F.logsigmoid(z * logits).sum() / note.shape[0]


def _check_pair(note: Tensor, text: Tensor) -> None:
    if note.ndim != 2 or note.shape != text.shape:
        raise ValueError(
            f"expected note and text features of the same shape (B, D), got {tuple(note.shape)} and "
            f"{tuple(text.shape)}"
        )


# ---------------------------------------------------------------- distributed


def world() -> tuple[int, int]:
    """(rank, world_size) of the default process group, (0, 1) when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _GatherWithGrad(torch.autograd.Function):
    """all_gather along dim 0 whose backward sums the gradients from every rank and keeps the local slice.

    Written out (instead of ``torch.distributed.nn.all_gather``) because its gloo backward needs all_to_all.
    """

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        rank, size = dist.get_rank(), dist.get_world_size()
        ctx.rank, ctx.n = rank, x.shape[0]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)  # (W*B, ...)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n]


def gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` (B, ...) from all ranks in rank order -> (W*B, ...), differentiable.

    Every rank must pass the same shape. Identity when not distributed. Each rank then computes the
    full-batch loss; the backward sums every rank's gradient onto the local slice, so after DDP's
    gradient averaging the parameter gradients equal those of one process on the full batch.
    """
    _, size = world()
    if size == 1:
        return x
    return _GatherWithGrad.apply(x)


def gather_no_grad(x: Tensor) -> Tensor:
    """all_gather along dim 0 without gradient (for masks and ids); identity when not distributed."""
    _, size = world()
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=0)
