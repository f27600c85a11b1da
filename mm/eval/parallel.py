"""Data-parallel evaluation: under ``torchrun`` each process answers a share of the items, and every
process gets all the answers back in item order.

    torchrun --nproc_per_node 4 -m mm eval pope --model DIR --questions pope.jsonl --image-folder IMGS

:func:`strided_map` is what the generators use (:func:`mm.eval.generate.adapter_generate`, the claims
eval): rank ``r`` of ``w`` runs items ``r, r + w, r + 2w, ...`` (so every rank gets as many of the long and
the short ones), then one ``all_gather_object`` puts the results back in order. Alone, it is a plain call.
Greedy answers do not depend on the other rows of a batch beyond float rounding in the padded forward, so
the scores are one process's (tested). A rank that fails (an unreadable image, out of memory) still takes
part in the gather, so every rank stops with the error instead of waiting. :func:`join_eval` joins the
launch's group and gives each process its own GPU; :func:`is_writer` tells rank 0, the only one that
prints and writes files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch.distributed as dist

from mm.errors import UserError
from mm.train.common import rank_world

T = TypeVar("T")


def is_writer() -> bool:
    """Whether this process prints and writes (rank 0, or the only process)."""
    return rank_world()[0] == 0


def strided_map(fn: Callable[[Sequence[int]], list[T]], n: int) -> list[T]:
    """``fn(indices)`` returns the results of those items, in order; the results of items ``0 .. n-1``,
    each computed by one rank (module docstring)."""
    rank, world = rank_world()
    if world == 1:
        return fn(range(n))
    mine = range(rank, n, world)
    try:
        local, failure = fn(mine), None
        if len(local) != len(mine):
            raise RuntimeError(f"expected {len(mine)} results from this rank's items, got {len(local)}")
    except Exception as e:  # every rank must reach the gather, or the others wait in it forever
        local, failure = None, e
    parts: list[Any] = [None] * world
    dist.all_gather_object(
        parts, (local, None if failure is None else f"{type(failure).__name__}: {failure}")
    )
    if failure is not None:
        raise failure
    failed = [(r, msg) for r, (_, msg) in enumerate(parts) if msg is not None]
    if failed:
        r, msg = failed[0]
        raise UserError(f"process {r} of {world} failed on its share of the items: {msg}")
    return [parts[i % world][0][i // world] for i in range(n)]


def join_eval(device: str | None) -> str | None:
    """Join the launch's process group when ``WORLD_SIZE`` > 1 (gloo, plus nccl on GPUs) and return the
    device this process evaluates on: its own GPU (``cuda:LOCAL_RANK``) unless ``device`` names another
    kind; ``device`` unchanged alone."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return device
    import torch

    from mm.train.common import init_distributed

    gpu = torch.cuda.is_available() and device in (None, "cuda", "auto")
    init_distributed("cpu:gloo,cuda:nccl" if gpu else "gloo")
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if gpu else device
