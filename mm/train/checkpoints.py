"""Checkpoints: one folder per step, written to ``.tmp-step-XXXXXXXX``, fsynced (files, then the folder) and
renamed into place, so a kill or a power cut never leaves a half-written ``step-*`` folder::

    OUT/checkpoints/step-00000120/
        model.safetensors       model weights (safetensors.torch.save_model: tied weights are fine)
        state.safetensors       every tensor of optimizer / scheduler / RNG / extra state
        state.json              the non-tensor skeleton of that state + step + config

Resume equality: the torch / numpy / python RNG states are saved, and batch order is a pure function of
``(seed, step)`` (:func:`mm.train.common.batch_indices`), so ``N`` steps straight and ``k`` steps + kill +
resume give the same weights. Under DDP only rank 0's RNG state is saved (per-rank dropout noise is not
reproduced).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from mm.train.metrics import fsync_dir

CHECKPOINT_PREFIX = "step-"


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states (CUDA too when available)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.asarray(np_state[1], dtype=np.uint32), *np_state[2:]))  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _flatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON skeleton of ``obj`` with every tensor / ndarray moved into ``tensors``."""
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(obj.astype(np.int64) if obj.dtype.kind == "u" else obj.copy())
        return {"__ndarray__": key, "dtype": str(obj.dtype)}
    if isinstance(obj, dict):
        return {"__dict__": [[k, _flatten(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"__tuple__" if isinstance(obj, tuple) else "__list__": [_flatten(v, tensors) for v in obj]}
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"__float__": repr(obj)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a value of type {type(obj).__name__}: {obj!r}")


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return tensors[obj["__ndarray__"]].numpy().astype(obj["dtype"])
        if "__dict__" in obj:
            return {k: _unflatten(v, tensors) for k, v in obj["__dict__"]}
        if "__tuple__" in obj:
            return tuple(_unflatten(v, tensors) for v in obj["__tuple__"])
        if "__list__" in obj:
            return [_unflatten(v, tensors) for v in obj["__list__"]]
        if "__float__" in obj:
            return float(obj["__float__"])
    return obj


def save_checkpoint(
    ckpt_dir: str | Path,
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    config: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    keep_last: int = 2,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write ``ckpt_dir/step-XXXXXXXX`` atomically (fsynced temp folder, then rename); keep ``keep_last``.

    Saves model weights, optimizer and scheduler state, RNG states, ``step``, ``config`` and ``extra``.
    ``optimizer_state`` replaces ``optimizer.state_dict()`` (FSDP saves the gathered, name-keyed state:
    :func:`mm.train.fsdp.full_optimizer_state`). Call on the main process only.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    root = Path(ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"{CHECKPOINT_PREFIX}{step:08d}"
    tmp = root / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(_unwrap(model), str(tmp / "model.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    if optimizer_state is None and optimizer is not None:
        optimizer_state = optimizer.state_dict()
    state = {
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
        "extra": extra or {},
    }
    skeleton = _flatten(state, tensors)
    save_file(tensors, str(tmp / "state.safetensors"))
    meta = {"step": step, "config": config or {}, "state": skeleton}
    (tmp / "state.json").write_text(json.dumps(meta, indent=1))
    for f in tmp.iterdir():  # the files, then the folder, reach the disk before the rename publishes them
        _fsync_file(f)
    fsync_dir(tmp)
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(root)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old)
    return final


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders under ``ckpt_dir``, oldest first (temp folders are ignored)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and (p / "state.json").is_file():
            try:
                found.append((int(p.name[len(CHECKPOINT_PREFIX) :]), p))
            except ValueError:
                continue
    return [p for _, p in sorted(found)]


def find_last_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    ckpts = list_checkpoints(ckpt_dir)
    return ckpts[-1] if ckpts else None


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """``{"step", "config"}`` of a checkpoint folder, without loading any tensor."""
    p = Path(path)
    if not (p / "state.json").is_file():
        raise FileNotFoundError(
            f"{p} is not a checkpoint folder (no state.json); pass a {CHECKPOINT_PREFIX}* folder"
        )
    meta = json.loads((p / "state.json").read_text())
    return {"step": meta["step"], "config": meta["config"]}


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint folder into model / optimizer / scheduler; returns step, config, extra and the
    saved optimizer state (``optimizer``: for a caller that loads it itself, e.g. under FSDP)."""
    p = Path(path)
    if not (p / "state.json").is_file():
        raise FileNotFoundError(
            f"{p} is not a checkpoint folder (no state.json); pass a {CHECKPOINT_PREFIX}* folder"
        )
    load_model(_unwrap(model), str(p / "model.safetensors"))
    meta = json.loads((p / "state.json").read_text())
    state = _unflatten(meta["state"], load_file(str(p / "state.safetensors")))
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        set_rng_state(state["rng"])
    info = {"step": meta["step"], "config": meta["config"], "extra": state["extra"]}
    return {**info, "optimizer": state["optimizer"]}


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP / DataParallel wrapper (or the model itself)."""
    return model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model
