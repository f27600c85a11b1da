"""Fully sharded data parallel (torch FSDP2, ``fully_shard``) inside the training skeleton.

When ``train.fsdp: true`` (or ``accelerate launch`` with an FSDP config: ``ACCELERATE_USE_FSDP=true``)
and the process group is joined (a multi-process launch), :func:`mm.train.loop.run` shards the model
over the ranks instead of all-reducing whole gradients itself:

- every transformer block (the classes in the ``_no_split_modules`` of the model and its sub-models,
  e.g. ``Qwen2DecoderLayer``) becomes its own FSDP unit; the parameters outside the blocks (embeddings,
  output head, fusion, a vision tower without declared blocks) stay whole on every rank. The root is
  not sharded on purpose: FSDP2 gathers a unit's weights when the unit's own ``forward`` is called, and
  trainers call parts of the model directly (``mm train``'s loss runs ``model.model`` and
  ``model.lm_head``, never the root's forward), while every block is always called through its module;
- FSDP replaces the blocks' parameters by sharded ``DTensor`` s, so the optimizer built on the plain
  model is pointed at them by name (:func:`shard_model`, before any optimizer step);
- FSDP reduce-scatters and averages the blocks' gradients; the skeleton all-reduces the rest as in DDP,
  and clips the global norm over both (:func:`clip_grad_norm`);
- checkpoints, held-out evaluation and the final save need whole weights: every rank takes part in
  gathering them (:func:`gather_into`) into a plain copy of the model that rank 0 keeps on the CPU
  (:class:`FullCopy`), and rank 0 saves and evaluates that copy. Optimizer state is saved whole, keyed
  by parameter name, and resharded on resume.

Sampling from a sharded model (GRPO rollouts, on-policy pairs) keeps every rank stepping until all are
done (:func:`synced_generation`: HF ``generate``'s ``synced_gpus``, and the same in
:func:`rl.trainers.rollout.sample_tokens`), since each decode step is a collective.

Cost: rank 0 holds one more copy of the weights in host memory. One process (``WORLD_SIZE`` 1) joins no
group and trains the plain model; a script that joins a one-process group itself gets FSDP over one
rank (how ``benchmarks/gpu_check_train.py`` checks the path on one GPU). A model that declares no
blocks is refused (nothing would be sharded: use DDP).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from mm.errors import UserError

FSDP_ENV = "ACCELERATE_USE_FSDP"
"""Set to ``true`` by ``accelerate launch`` with ``distributed_type: FSDP``."""


def fsdp_requested(flag: bool) -> bool:
    """``train.fsdp`` or accelerate's FSDP launch environment."""
    return flag or os.environ.get(FSDP_ENV, "false").lower() in ("1", "true")


def block_classes(model: nn.Module) -> set[str]:
    """Class names of the transformer blocks to shard one by one (``_no_split_modules`` of every
    sub-model that declares them)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return names


def shard_model(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Apply ``fully_shard`` to each block of ``model``, in place (outermost blocks only), and point
    ``optimizer`` at the sharded parameters (its state must still be empty); returns the block names."""
    from torch.distributed.fsdp import fully_shard

    if optimizer.state:
        raise RuntimeError("shard the model before the first optimizer step (the optimizer has state)")
    name_of = {id(p): n for n, p in model.named_parameters()}
    classes = block_classes(model)
    blocks: list[str] = []
    for n, m in model.named_modules():
        if type(m).__name__ in classes and not any(n.startswith(b + ".") for b in blocks):
            blocks.append(n)
    if not blocks or blocks == [""]:
        raise UserError(
            f"train.fsdp: {type(model).__name__} declares no transformer blocks (_no_split_modules) to "
            "shard; train it data parallel instead (train.fsdp: false, configs/accelerate/ddp.yaml)"
        )
    for name in blocks:
        fully_shard(model.get_submodule(name), reshard_after_forward=True)
    sharded = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [sharded[name_of[id(p)]] for p in group["params"]]
    return blocks


def is_sharded(model: nn.Module) -> bool:
    """True when some module of ``model`` is an FSDP unit (:func:`shard_model`)."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def synced_generation(model: nn.Module) -> bool:
    """Whether sampling from ``model`` must keep every rank stepping until all ranks are done (HF
    ``generate``'s ``synced_gpus``): its blocks are sharded over several ranks, so every forward is a
    collective, and a rank whose rows all ended early would leave the others waiting in it forever."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and is_sharded(model)


def synced_kwargs(model: nn.Module) -> dict[str, bool]:
    """HF ``generate`` keywords for ``model``: ``synced_gpus`` when :func:`synced_generation`."""
    return {"synced_gpus": True} if synced_generation(model) else {}


def any_rank(flag: bool) -> bool:
    """``flag`` or'ed over the ranks (a collective)."""
    t = torch.tensor([float(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def is_dtensor(t: torch.Tensor) -> bool:
    """True for a sharded FSDP parameter or gradient."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over sharded (``DTensor``) and whole gradients together: the
    global norm (shards' squares summed over ranks in one all-reduce, whole gradients counted once) and
    the same clip coefficient, ``max_norm / (norm + 1e-6)`` capped at 1 (0 = no clipping); the norm."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    local = [g.to_local() for g in grads if is_dtensor(g)]
    whole = [g for g in grads if not is_dtensor(g)]
    device = (local or whole)[0].device
    sharded_sq = _squares(local, device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sharded_sq)  # the shards' squares summed over ranks: the blocks' whole squares
    norm = float((sharded_sq + _squares(whole, device)).sqrt())
    if max_norm > 0:
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for g in [*local, *whole]:
                g.mul_(coef)
    return norm


class FullCopy:
    """A plain (unsharded) copy of the model on rank 0's CPU, refreshed from the sharded one on demand."""

    def __init__(self, model: nn.Module, *, keep: bool) -> None:
        """Copy ``model`` (call before sharding it) when ``keep`` (rank 0); other ranks keep nothing."""
        self.module = copy.deepcopy(model).to("cpu") if keep else None

    def refresh(self, sharded: nn.Module) -> nn.Module | None:
        """Gather ``sharded``'s weights into the copy (a collective: every rank calls it); the copy on
        rank 0, None elsewhere."""
        gather_into(sharded, self.module)
        return self.module


def gather_into(sharded: nn.Module, target: nn.Module | None) -> None:
    """All-gather the full weights of ``sharded`` (every rank calls it) and load them into ``target`` on
    rank 0 (``target`` None on the other ranks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(sharded, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if target is not None:
        target.load_state_dict(full)


def _squares(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of the squared entries of ``grads`` (float64 scalar on ``device``; 0 for none)."""
    out = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads:
        out += g.double().pow(2).sum()
    return out


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state of a sharded model, whole and keyed by parameter name (a collective; the
    state on rank 0's CPU, empty elsewhere)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=opts)


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Shard a whole, name-keyed optimizer state (:func:`full_optimizer_state`) into ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
