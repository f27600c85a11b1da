"""Training utilities shared by every trainer (pretrain, NoteVLM align/SFT, RL): seeding, deterministic
batch order, JSONL metrics, PNG plots, atomic safetensors checkpoints with resume, DDP set-up, progress.

Checkpoint layout (one folder per step, written to ``.tmp-step-XXXXXXXX`` then renamed, so a kill never
leaves a half-written ``step-*`` folder)::

    OUT/checkpoints/step-00000120/
        model.safetensors       model weights (safetensors.torch.save_model: tied weights are fine)
        state.safetensors       every tensor of optimizer / scheduler / RNG / extra state
        state.json              the non-tensor skeleton of that state + step + config

Resume equality: batch order is a pure function of ``(seed, step)`` (:func:`batch_indices`), and the
torch / numpy / python RNG states are saved, so ``N`` steps straight and ``k`` steps + kill + resume give
the same weights. Under DDP only rank 0's RNG state is saved (per-rank dropout noise is not reproduced).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_PREFIX = "step-"


# ---------------------------------------------------------------- seeding and data order


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (the legacy global RNG is what libraries use)
    torch.manual_seed(seed)


def batch_indices(n: int, batch_size: int, *, seed: int, step: int) -> list[int]:
    """Indices of the global batch for ``step``: a pure function of ``(seed, step)``.

    Walks epoch-wise random permutations of ``range(n)`` (permutation of epoch e seeded by ``(seed, e)``);
    a batch that crosses an epoch boundary takes the tail of one permutation and the head of the next.
    """
    if n <= 0 or batch_size <= 0:
        raise ValueError(f"need n > 0 and batch_size > 0, got n={n}, batch_size={batch_size}")
    start = step * batch_size
    out: list[int] = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n)
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        perm = torch.randperm(n, generator=g).tolist()
        out.extend(perm[offset : offset + batch_size - len(out)])
    return out


class LengthGroupedBatches:
    """Batches of similar length (transformers' ``group_by_length``): far less padding in a batch.

    Epoch ``e`` takes a random permutation of the samples (seeded by ``(seed, e)``), cuts it into
    megabatches of ``megabatch`` batches, sorts each megabatch by length (longest first) and cuts it into
    batches, then shuffles the epoch's batches (so long and short ones alternate at random). An epoch has
    ``n // batch_size`` batches: the remainder of its permutation is left out, and a different one each
    epoch. ``indices(step)`` is a pure function of ``(seed, step)``, so resume stays exact.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, *, seed: int, megabatch: int = 50) -> None:
        if batch_size <= 0 or megabatch <= 0:
            raise ValueError(f"need batch_size > 0 and megabatch > 0, got {batch_size}, {megabatch}")
        if len(lengths) < batch_size:
            raise ValueError(
                f"{len(lengths)} samples cannot fill one batch of {batch_size}; lower the batch size"
            )
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)  # (n,)
        self.batch_size, self.seed, self.megabatch = batch_size, seed, megabatch
        self.per_epoch = len(lengths) // batch_size
        self._epoch: tuple[int, list[list[int]]] | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The ``n // batch_size`` batches of ``epoch``, in training order."""
        n, b = len(self.lengths), self.batch_size
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(n, generator=g)[: self.per_epoch * b]  # (per_epoch * b,)
        batches: list[list[int]] = []
        for mega in perm.split(self.megabatch * b):
            order = torch.sort(self.lengths[mega], descending=True, stable=True).indices
            batches += [c.tolist() for c in mega[order].split(b)]
        shuffle = torch.randperm(len(batches), generator=g).tolist()
        return [batches[i] for i in shuffle]

    def indices(self, step: int) -> list[int]:
        """Indices of the global batch for ``step``."""
        epoch, k = divmod(step, self.per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self.epoch_batches(epoch))
        return list(self._epoch[1][k])


def shard(indices: Sequence[int], *, rank: int, world_size: int) -> list[int]:
    """This rank's contiguous slice of a global batch (the batch size must divide by world_size)."""
    if len(indices) % world_size:
        raise ValueError(
            f"global batch of {len(indices)} does not split over {world_size} ranks; "
            f"use a batch size divisible by the number of processes"
        )
    per = len(indices) // world_size
    return list(indices[rank * per : (rank + 1) * per])


# ---------------------------------------------------------------- distributed


def init_distributed() -> tuple[int, int]:
    """Join the process group when launched by torchrun / accelerate (env ``WORLD_SIZE`` > 1).

    Always gloo: the ``mm`` trainers keep their tensors on the CPU, and nccl only reduces CUDA tensors (it
    would fail on a GPU machine). Returns ``(rank, world_size)``; ``(0, 1)`` single-process.
    """
    import torch.distributed as dist

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def is_main_process() -> bool:
    """True on rank 0 or when not distributed."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def barrier() -> None:
    """Synchronise ranks; no-op single-process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` summed over ranks (``x`` itself, detached, single-process); no gradient."""
    import torch.distributed as dist

    out = x.detach().clone()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP / DataParallel wrapper (or the model itself)."""
    return model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model


# ---------------------------------------------------------------- metrics and plots


class MetricsLogger:
    """Append one JSON object per line to ``path``; on resume, drops records past ``resume_step``.

    Only the main process writes (others get a no-op logger), so DDP runs produce one file.
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            _atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def log(self, record: dict[str, Any]) -> None:
        """Write ``record`` (plain numbers/strings; tensors are converted with ``.item()``)."""
        if not self.enabled:
            return
        clean = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics JSONL file ([] when it does not exist)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def plot_metrics(
    records: Iterable[dict[str, Any]],
    keys: Sequence[str],
    out_png: str | Path,
    *,
    x: str = "step",
    title: str = "",
) -> Path:
    """One panel per key (its records plotted against ``x``), saved as a PNG with matplotlib's Agg backend.

    Keys no record has are drawn as an empty panel labelled "no data" rather than failing.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        pts = [(r[x], r[key]) for r in records if key in r and x in r and r[key] is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="." if len(pts) < 30 else None)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(x)
        ax.set_title(key)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# ---------------------------------------------------------------- progress


def progress(total: int, *, initial: int = 0, desc: str = "", enabled: bool = True):
    """A tqdm bar over steps (disabled on non-main ranks or when ``enabled`` is False)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True)


# ---------------------------------------------------------------- checkpoints


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


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
) -> Path:
    """Write ``ckpt_dir/step-XXXXXXXX`` atomically (temp folder + rename); keep the newest ``keep_last``.

    Saves model weights, optimizer and scheduler state, RNG states, ``step``, ``config`` and ``extra``.
    Call on the main process only.
    """
    from safetensors.torch import save_file, save_model

    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    root = Path(ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"{CHECKPOINT_PREFIX}{step:08d}"
    tmp = root / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(unwrap(model), str(tmp / "model.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    state = {
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
        "extra": extra or {},
    }
    skeleton = _flatten(state, tensors)
    save_file(tensors, str(tmp / "state.safetensors"))
    meta = {"step": step, "config": config or {}, "state": skeleton}
    (tmp / "state.json").write_text(json.dumps(meta, indent=1))
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
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
    """Load a checkpoint folder into model / optimizer / scheduler; returns step, config and extra."""
    from safetensors.torch import load_file, load_model

    p = Path(path)
    if not (p / "state.json").is_file():
        raise FileNotFoundError(
            f"{p} is not a checkpoint folder (no state.json); pass a {CHECKPOINT_PREFIX}* folder"
        )
    load_model(unwrap(model), str(p / "model.safetensors"))
    meta = json.loads((p / "state.json").read_text())
    state = _unflatten(meta["state"], load_file(str(p / "state.safetensors")))
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return {"step": meta["step"], "config": meta["config"], "extra": state["extra"]}
