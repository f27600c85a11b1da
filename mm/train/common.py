"""Training utilities shared by every trainer (pretrain, NoteVLM align/SFT, RL): seeding, deterministic
batch order and DDP set-up; run files (:mod:`mm.train.metrics`) and checkpoints
(:mod:`mm.train.checkpoints`) are re-exported here.

Resume equality needs the batch order to be a pure function of ``(seed, step)`` (:func:`batch_indices`).
"""

from __future__ import annotations

import atexit
import os
import random
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist

from mm.errors import UserError
from mm.train.checkpoints import (
    CHECKPOINT_PREFIX,
    find_last_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_checkpoint_meta,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from mm.train.metrics import MetricsLogger, TornMetricsWarning, plot_metrics, progress, read_metrics

T = TypeVar("T")

__all__ = [
    "CHECKPOINT_PREFIX", "LengthGroupedBatches", "MetricsLogger", "TornMetricsWarning", "all_reduce_sum",
    "barrier", "batch_indices", "find_last_checkpoint", "init_distributed", "is_main_process", "join_launch",
    "list_checkpoints", "load_checkpoint", "on_rank0", "plot_metrics", "progress", "read_checkpoint_meta",
    "read_metrics", "rng_state", "save_checkpoint", "seed_everything", "set_rng_state", "shard", "unwrap",
]  # fmt: skip


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


def init_distributed(backend: str = "gloo") -> tuple[int, int]:
    """Join the process group when launched by torchrun / accelerate (env ``WORLD_SIZE`` > 1).

    gloo reduces CPU tensors; a run on GPUs passes ``"cpu:gloo,cuda:nccl"`` (each collective goes to the
    backend of its tensors' device: metrics stay on the CPU, gradients on the GPU). A group already joined
    is kept. Returns ``(rank, world_size)``; ``(0, 1)`` single-process.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group(backend)
        # Leave the group before the interpreter exits: a live gloo group torn down at exit can abort
        # the process ("terminate called without an active exception") after the work is done.
        atexit.register(_leave_group)
    return dist.get_rank(), dist.get_world_size()


def join_launch() -> tuple[int, int]:
    """Join the launch's process group for a command that chains several stages in one process
    (``rl pipeline``, ``mm compare-fusion``): gloo, plus nccl with each process on the GPU of its
    ``LOCAL_RANK`` when there are GPUs; ``(0, 1)`` alone. The stages' trainers keep the group joined here."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        return init_distributed("cpu:gloo,cuda:nccl")
    return init_distributed()


def _leave_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_world() -> tuple[int, int]:
    """``(rank, world)`` of the joined process group; ``(0, 1)`` single-process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main_process() -> bool:
    """True on rank 0 or when not distributed."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def barrier() -> None:
    """Synchronise ranks; no-op single-process."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def on_rank0(fn: Callable[[], T]) -> T:
    """``fn()`` run by rank 0 alone (work that writes shared files: a data folder, a stage marker); every rank
    returns its result once it is done, or raises its error. Alone, a plain call.

    The result must pickle (it is broadcast). When ``fn`` fails on rank 0 the other ranks raise a
    ``UserError`` that names it instead of waiting for a result that never comes.
    """
    rank, world = rank_world()
    if world == 1:
        return fn()
    result, failure = None, None
    if rank == 0:
        try:
            result = fn()
        except Exception as e:  # every rank must reach the broadcast
            failure = e
    box = [(result, None if failure is None else f"{type(failure).__name__}: {failure}")]
    dist.broadcast_object_list(box, src=0)
    if failure is not None:
        raise failure
    value, message = box[0]
    if message is not None:
        raise UserError(f"process 0 of {world} failed: {message}")
    return value


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` summed over ranks (``x`` itself, detached, single-process); no gradient."""
    out = x.detach().clone()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP / DataParallel wrapper (or the model itself)."""
    return model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model
