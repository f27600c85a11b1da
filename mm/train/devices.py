"""Where and in what precision the training skeleton (:mod:`mm.train.loop`) runs: the device of
``train.device``, batches moved there, bf16 autocast for ``train.precision``, gradient checkpointing for
``train.gradient_checkpointing``.

Precision follows the usual mixed-precision recipe (Micikevicius et al. 2018, with bf16 no loss scaling
is needed): the trainable weights (the optimizer's "master" copy) stay float32, the forward runs under
``torch.autocast(dtype=torch.bfloat16)``, so matmuls take bf16 inputs while reductions, softmax and
cross-entropy stay float32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from mm.errors import UserError

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
"""Values ``train.device`` accepts."""
PRECISIONS = ("fp32", "bf16")
"""Values ``train.precision`` accepts."""


def launched_processes() -> int:
    """Processes of the launch (``WORLD_SIZE`` set by torchrun / accelerate launch; 1 otherwise)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_device(name: str, key: str = "train.device") -> torch.device:
    """The ``torch.device`` of a ``train.device`` value, made current when it is a GPU.

    ``auto`` is cuda when a GPU is visible, else cpu. ``cuda`` (or ``auto`` on a GPU machine) under a
    multi-process launch takes the GPU of the process's ``LOCAL_RANK``; ``cuda:N`` pins GPU N and is
    refused under a multi-process launch (every process would share one GPU). ``key`` names the setting in
    errors.
    """
    if not DEVICE_PATTERN.fullmatch(name):
        raise UserError(f"{key} must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"{key}={name} but no CUDA device is visible; use {key}=auto or cpu")
    count = torch.cuda.device_count()
    if name.startswith("cuda:"):
        index = int(name.split(":")[1])
        if index >= count:
            raise UserError(
                f"{key}={name} but only {count} CUDA device(s) are visible; use cuda:0..{count - 1}"
            )
        if launched_processes() > 1:
            raise UserError(
                f"{key}={name} pins one GPU for every process of a multi-process launch; use "
                f"{key}=cuda or auto (each process takes the GPU of its LOCAL_RANK)"
            )
    else:
        index = int(os.environ.get("LOCAL_RANK", "0")) % count
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor inside moved to ``device`` (dicts, lists, tuples, named tuples and
    dataclass instances are rebuilt; other values are returned as they are)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=device.type == "cuda")
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **fields)
    return obj


class SlowPrecisionWarning(UserWarning):
    """bf16 autocast on the CPU: correct but usually slower than float32."""


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse an unknown ``train.precision``; warn that bf16 on the CPU is slow."""
    if precision not in PRECISIONS:
        raise UserError(f"train.precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16" and device.type == "cpu":
        warnings.warn(
            "train.precision=bf16 on the CPU: bf16 autocast is emulated there and usually slower than "
            "fp32; use fp32 on the CPU, bf16 on a GPU",
            SlowPrecisionWarning,
            stacklevel=2,
        )


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to bf16 on ``device`` for ``precision="bf16"``; a no-op context for fp32."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def keep_fp32_master_weights(model: torch.nn.Module) -> int:
    """Cast trainable floating-point parameters that are not float32 to float32 in place (a model loaded
    in bf16 trains float32 master weights; frozen weights keep their dtype); returns how many were cast.

    The parameters stay the same objects, so an optimizer built on them keeps working.
    """
    cast = 0
    for p in model.parameters():
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()
            cast += 1
    return cast


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Activation checkpointing through the model's own switch (transformers models and PEFT wrappers of
    them: ``activation_checkpointing_enable``, transformers 5's name for ``gradient_checkpointing_enable``,
    which older versions have alone); non-reentrant, so frozen input embeddings need no special care.

    A model already checkpointing is left as it is.
    """
    new = getattr(model, "activation_checkpointing_enable", None)
    old = getattr(model, "gradient_checkpointing_enable", None)
    if new is None and old is None:
        raise UserError(
            f"train.gradient_checkpointing=true but {type(model).__name__} has no "
            "gradient_checkpointing_enable (only transformers models do); set train.gradient_checkpointing "
            "to false for this trainer"
        )
    if is_checkpointing(model):
        return
    kwargs = {"use_reentrant": False}
    if new is not None:
        new(kwargs)
    else:
        old(gradient_checkpointing_kwargs=kwargs)


def is_checkpointing(model: torch.nn.Module) -> bool:
    """True when ``model`` checkpoints activations (transformers' flag under either name)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        flag = getattr(model, name, None)  # a PEFT wrapper forwards it to the transformers model
        if flag is not None:
            return bool(flag)
    return False


@contextlib.contextmanager
def moved(module: torch.nn.Module, device: torch.device, back: torch.device) -> Iterator[torch.nn.Module]:
    """``module`` on ``device`` inside the block, on ``back`` after it."""
    module.to(device)
    try:
        yield module
    finally:
        module.to(back)
