"""Config sections every trainer shares: the optimiser + schedule (:class:`OptimConfig`) and the run
(:class:`RunConfig`: length, seed, logging and checkpoint cadence, threads, device, precision, gradient
checkpointing, FSDP).

Each trainer keeps its own defaults by subclassing a section and restating only the fields whose default
differs (``class PretrainOptimConfig(OptimConfig)``); the fields, their checks, the schedule
(:func:`lr_lambda`) and the optimiser construction (:func:`build_optimizer`) exist once, here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mm.errors import UserError
from mm.train.devices import DEVICE_PATTERN, PRECISIONS


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW with linear warm-up and cosine decay to ``min_lr_ratio * lr``."""

    lr: float = 1e-3
    """Peak learning rate (0 = the weights do not move, e.g. to evaluate a starting point)."""
    weight_decay: float = 0.0
    """Decoupled weight decay on matrices (never on biases, norms or a learned temperature)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 20
    """Linear warm-up steps (0 = start at the peak rate)."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of lr (1.0 = constant after warm-up)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables clipping (the norm is still logged)."""

    def __post_init__(self) -> None:
        if not (self.lr >= 0 and self.eps > 0):  # lr 0 runs the loop without moving the weights
            raise ValueError(f"need optim.lr >= 0 and optim.eps > 0, got {self.lr} and {self.eps}")
        if self.grad_clip < 0 or self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError(
                "need optim.grad_clip >= 0, optim.warmup_steps >= 0 and optim.weight_decay >= 0, got "
                f"{self.grad_clip}, {self.warmup_steps} and {self.weight_decay}"
            )
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {self.betas}")


@dataclass(kw_only=True)
class RunConfig:
    """Length of the run, seed, logging and checkpoint cadence."""

    steps: int = 300
    """Optimizer steps."""
    seed: int = 0
    """Seed of the model init, the data order and sampling."""
    log_every: int = 10
    """Write a metrics record every n steps (and at the last step)."""
    checkpoint_every: int = 100
    """Write a checkpoint every n steps (and at the last step)."""
    keep_last: int = 2
    """How many checkpoints to keep."""
    threads: int = 0
    """torch.set_num_threads; 0 leaves the default."""
    device: str = "auto"
    """auto (cuda when a GPU is visible, else cpu), cpu, cuda or cuda:N; under a multi-process launch
    auto and cuda take the GPU of the process's LOCAL_RANK (mm.train.devices.resolve_device)."""
    precision: str = "fp32"
    """fp32, or bf16: forward and loss under bf16 autocast with float32 master weights (trainable weights
    loaded in bf16/fp16 are cast to float32); slow on the CPU. fp32 trains the weights in their dtype."""
    gradient_checkpointing: bool = False
    """Activation checkpointing through the model's gradient_checkpointing_enable (transformers models)."""
    fsdp: bool = False
    """Shard the model with torch FSDP2 under a multi-process launch (mm.train.fsdp); also on when
    accelerate launch runs an FSDP config (ACCELERATE_USE_FSDP=true)."""

    def __post_init__(self) -> None:
        for name in ("steps", "log_every", "checkpoint_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.threads < 0:
            raise ValueError(f"train.threads must be >= 0 (0 = the default), got {self.threads}")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise ValueError(f"train.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision must be one of {PRECISIONS}, got {self.precision!r}")


@dataclass(kw_only=True)
class BatchRunConfig(RunConfig):
    """A :class:`RunConfig` whose trainer draws a global batch of ``batch_size`` samples per step and
    evaluates on held-out data every ``eval_every`` steps (``mm pretrain``, ``mm train``)."""

    batch_size: int = 32
    """Global batch size (samples); split evenly across DDP ranks."""
    eval_every: int = 100
    """Evaluate on held-out data every n steps (and at the end)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")


def lr_lambda(cfg: OptimConfig, steps: int) -> Callable[[int], float]:
    """Linear warm-up then cosine decay to ``min_lr_ratio`` (a multiplier of lr, for LambdaLR)."""

    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return f


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Trainable parameters in two AdamW groups: decay on matrices, none on vectors (biases, norms)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def build_optimizer(
    groups: list[dict[str, Any]], cfg: OptimConfig, steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``groups`` (see :func:`param_groups`) and its warm-up + cosine LambdaLR schedule."""
    if not any(g["params"] for g in groups):
        raise UserError("nothing to train: every parameter is frozen")
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg, steps))
