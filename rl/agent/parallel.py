"""``rl agent`` data parallel: under ``torchrun`` every process holds the whole policy and takes a share.

    torchrun --nproc_per_node 4 -m rl agent --config agent.yaml --out runs/a --set policy.device=cuda

- SFT: each step's demonstrations are cut into contiguous shares; a rank's loss is its share of the global
  batch's token-mean (its tokens over all ranks' tokens), and gradients are averaged over ranks, so a step
  is one process's step on the whole batch.
- GRPO: each rank rolls out a contiguous share of the step's tasks (whole groups, seeded by step and
  rank); the rewards are all-gathered, so ``scale: batch`` advantages are the global batch's; the loss's
  normaliser (tokens or sequences) is counted over all ranks.
- PPO: each rank rolls out its share of the tasks and computes its values and GAE; the advantages are
  whitened, and the rollout's means taken, over every rank's tokens; the minibatch plan is one process's
  over every rank's rows, each rank takes the rows of each minibatch it holds (none, at times), and each
  minibatch's loss normalisers (tokens, sequences, the horizon) are counted over all ranks, so a step is
  one process's step on the same rollout.
- eval: each rank evaluates every world-th task; the rows are gathered back into task order.
- Only rank 0 writes (results, weights, checkpoints, metrics, eval rows, report, export); every stage ends
  at a barrier, so the next one reads what rank 0 wrote (one machine, or a shared file system). At the end
  of each training stage the ranks check that they hold the same weights.

- ``note_model.build``: the note model's pretraining and SFT sub-stages are their trainers' data
  parallelism (:mod:`rl.agent.note_model`); rank 0 exports the photos.
- perception: each rank replays and trains on a contiguous share of every step's items, as SFT; the
  reading check is shared out like the eval.
- GRPO turn credit with ``scale: batch`` divides by the std of every rank's judged replies (gathered).

The rollout counts each RL step logs (valid calls, truncations, goals) are every rank's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from mm.errors import UserError
from mm.train import common
from mm.train.common import rank_world


def is_writer() -> bool:
    """Whether this process writes OUT's files (rank 0, or the only process)."""
    return rank_world()[0] == 0


def join(device: torch.device) -> tuple[int, int]:
    """Join the launch's process group (gloo for CPU tensors, nccl for a GPU's); ``(0, 1)`` alone."""
    return common.init_distributed("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")


def barrier() -> None:
    if rank_world()[1] > 1:
        dist.barrier()


def share(items: Sequence[Any]) -> list[Any]:
    """This rank's contiguous share of ``items`` (their number divides by the ranks)."""
    rank, world = rank_world()
    return [items[i] for i in common.shard(list(range(len(items))), rank=rank, world_size=world)]


def total(value: float) -> float:
    """``value`` summed over ranks (float64)."""
    return float(common.all_reduce_sum(torch.tensor([value], dtype=torch.float64))[0])


def most(value: float) -> float:
    """``value``'s maximum over ranks."""
    if rank_world()[1] == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def gathered(local: list[Any]) -> list[Any]:
    """Every rank's list, concatenated in rank order (Python objects; one ``all_gather_object``)."""
    world = rank_world()[1]
    if world == 1:
        return list(local)
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, local)
    return [x for part in parts for x in part]


def strided(items: Sequence[Any]) -> list[Any]:
    """This rank's items: every world-th from its rank on (all of them alone)."""
    rank, world = rank_world()
    return list(items[rank::world])


def interleaved(local: list[Any]) -> list[Any]:
    """The results of every rank's :func:`strided` items, put back in the items' order."""
    rank, world = rank_world()
    if world == 1:
        return list(local)
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, local)
    n = sum(len(p) for p in parts)
    return [parts[i % world][i // world] for i in range(n)]


def check_in_sync(model: torch.nn.Module, where: str) -> None:
    """A ``RuntimeError`` unless every rank holds the same trainable weights (a float64 checksum each)."""
    if rank_world()[1] == 1:
        return
    with torch.no_grad():
        params = [p for p in model.parameters() if p.requires_grad]
        local = sum(float(p.detach().double().abs().sum() + p.detach().double().sum()) for p in params)
    sums = gathered([local])
    if len(set(sums)) != 1:
        raise RuntimeError(f"{where}: the ranks' weights differ (checksums {sums}); data parallel is broken")


def check_parallel(cfg: Any, world: int) -> None:
    """A ``UserError`` (before anything is written) for settings a ``world``-process launch cannot run."""
    if world <= 1:
        return
    shares = [("sft.batch_size", cfg.sft.batch_size), ("grpo.tasks_per_step", cfg.grpo.tasks_per_step)]
    if cfg.perception.steps > 0:
        shares.append(("perception.batch_size", cfg.perception.batch_size))
    if cfg.ppo.steps > 0:
        shares.append(("ppo.tasks_per_step", cfg.ppo.tasks_per_step))
    for key, n in shares:
        if n % world:
            raise UserError(f"{key}={n} must divide by the {world} processes (each takes an equal share)")
