"""THE training skeleton of every trainer (``mm pretrain``, ``mm train``, ``rl dpo``, ``rl grpo``).

A trainer is a :class:`StepTrainer`: it builds the batch of a step (``batch(step)``, this rank's shard of
the global batch) and its loss (``loss(batch) -> (loss, metrics)``). :func:`run` does the rest:

    model to train.device, float32 master weights, gradient checkpointing  (mm.train.devices)
    resume (config check, weights, optimizer, schedule, RNG, trainer state)
    FSDP2 sharding when train.fsdp (or accelerate's FSDP launch) and several processes (mm.train.fsdp)
    for step in range(start, run.steps):
        batch = trainer.batch(step) moved to the device   # under bf16 autocast for train.precision=bf16
        repeat trainer.updates_per_step times:            # GRPO's inner iterations; 1 elsewhere
            loss = trainer.loss(batch) (autocast); backward
            average gradients over ranks (DDP)            # each rank's loss is scaled for this;
                                                          # FSDP averages its blocks' own
            clip; optimizer step; trainer.after_update()
        scheduler step
        log (JSONL, rank 0), evaluate (rank 0), checkpoint (rank 0), progress bar

Data parallel: every rank holds the whole model and computes the gradient of its shard's loss; the
gradients are averaged with one all-reduce (what ``DistributedDataParallel`` does, without its wrapper,
so a trainer may run several forwards per backward and call the model as it likes). A trainer scales its
shard loss so that the average is the gradient of the global batch's loss (see
:func:`mm.train.sft.answer_token_divisor`). Only rank 0 writes files. :func:`setup` makes the run's GPU
current, joins the process group (:func:`mm.train.common.init_distributed`: gloo, plus nccl for CUDA
tensors), sets the thread count and seeds every RNG. Under FSDP (:mod:`mm.train.fsdp`) FSDP averages the
gradients, and checkpoints, evaluation and the final model come from the weights gathered on rank 0.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from mm.errors import UserError
from mm.train import common, devices, fsdp
from mm.train.config import RunConfig


class StepTrainer:
    """What a trainer owns: its model, its batch, its loss; optional hooks have no-op defaults."""

    model: torch.nn.Module
    """The model being trained (its trainable parameters are updated and checkpointed)."""
    updates_per_step: int = 1
    """Optimizer updates on each batch (GRPO's ``num_iterations``); the schedule steps once per step."""
    progress_keys: Sequence[str] = ()
    """Record keys shown on the progress bar next to the loss."""

    def batch(self, step: int) -> Any:
        """This rank's share of the global batch of ``step`` (a pure function of the seed and ``step``)."""
        raise NotImplementedError

    def loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(loss, metrics)``: the scalar to backpropagate and detached per-step metrics (numbers)."""
        raise NotImplementedError

    def after_update(self) -> None:
        """Called after every optimizer update (e.g. clamp a learned temperature)."""

    def step_metrics(self) -> dict[str, float]:
        """Metrics read after the step's updates (e.g. the temperature), on log steps."""
        return {}

    def evaluate(self) -> dict[str, Any]:
        """Held-out metrics (rank 0 only); keys starting with ``_`` are returned but not logged."""
        return {}

    def state(self) -> dict[str, Any]:
        """Trainer state saved in every checkpoint (e.g. a running mean)."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` returned."""


@dataclass(kw_only=True)
class LoopResult:
    """What :func:`run` reports."""

    step: int
    """Last optimizer step done."""
    seconds: float
    """Wall time of the loop (evaluation included)."""
    cpu_seconds: float
    """CPU time (all threads) of this process in the loop."""
    step_seconds: float
    """Mean seconds per step of this process (evaluation excluded)."""
    last: dict[str, Any]
    """The last metrics record."""
    metrics: dict[str, Any]
    """The last held-out evaluation of rank 0 ({} when none ran)."""
    stopped: bool
    """True when ``stop_after`` ended the run early (no final evaluation, plots or save)."""
    model: torch.nn.Module | None
    """The trained model to save: ``trainer.model``, or under FSDP a plain copy of the gathered weights
    on rank 0's CPU (None on the other ranks, and when ``stopped``)."""


class TrainingWarning(UserWarning):
    """A known failure pattern showed up in the training metrics (zero-std groups, entropy collapse, ...)."""


def setup(run: RunConfig, *, global_batch: int | None = None) -> tuple[int, int]:
    """Make ``run.device`` current, join the process group (torchrun / accelerate), set torch threads, seed
    every RNG; ``(rank, world)``.

    ``global_batch`` (samples per step) must divide by the number of processes.
    """
    if devices.resolve_device(run.device).type == "cuda":  # the GPU is made current before nccl starts
        rank, world = common.init_distributed("cpu:gloo,cuda:nccl")
    else:
        rank, world = common.init_distributed()
    if global_batch is not None and global_batch % world:
        raise UserError(
            f"the global batch of {global_batch} must be divisible by {world} processes; "
            "change the batch size or the number of processes"
        )
    if run.threads:
        torch.set_num_threads(run.threads)
    common.seed_everything(run.seed)
    return rank, world


def average_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Average the gradients of ``params`` over ranks in one all-reduce (no-op single-process).

    A parameter without a gradient on some ranks gets the others' average (its missing gradient counts as
    zero); one without a gradient on every rank keeps ``grad = None`` (AdamW then skips it, as it does in
    one process).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    ref = next((p.grad for p in params if p.grad is not None), params[0])
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(ref.dtype) for p in params
    ]
    has = torch.tensor([p.grad is not None for p in params], dtype=ref.dtype, device=ref.device)  # (P,)
    flat = torch.cat([*parts, has])  # (sum numel + P,)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat[: -len(params)] /= world
    offset = 0
    for p, seen in zip(params, flat[-len(params) :].tolist()):
        n = p.numel()
        if seen > 0:
            p.grad = flat[offset : offset + n].view_as(p).to(p.dtype).clone()
        offset += n


def broadcast_weights(model: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (no-op single-process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def mean_over_ranks(metrics: dict[str, Any], world: int) -> dict[str, Any]:
    """Numeric ``metrics`` as floats, averaged over ranks (float64, one all-reduce); others unchanged."""
    keys = [
        k for k, v in metrics.items() if isinstance(v, (int, float, torch.Tensor)) and not isinstance(v, bool)
    ]
    out = dict(metrics)
    if world == 1:  # no reduction: tensors become floats, Python numbers stay as they are
        out.update({k: float(metrics[k]) for k in keys if isinstance(metrics[k], torch.Tensor)})
        return out
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)  # (K,)
    values = common.all_reduce_sum(values) / world
    out.update(dict(zip(keys, values.tolist())))
    return out


def check_resume_config(saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
    """Refuse to resume from a checkpoint written with another config (only ``train.steps`` may differ)."""

    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(d, dict):
            return {prefix: d}
        return {k: v for key, val in d.items() for k, v in flat(val, f"{prefix}{key}.").items()}

    a, b = flat(json.loads(json.dumps(saved))), flat(json.loads(json.dumps(now)))
    for d in (a, b):
        d.pop("train.steps.", None)
    diff = sorted(k.rstrip(".") for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    if diff:
        raise UserError(
            f"{where} was written with a different config ({', '.join(diff[:6])} differ); use the same "
            "config to resume, choose a new --out folder, or pass --no-resume"
        )


def check_optimizer_layout(saved: dict[str, Any] | None, *, sharded: bool, where: Path) -> None:
    """Refuse to resume an FSDP checkpoint without FSDP or the reverse: FSDP saves the optimizer state
    keyed by parameter name, one process or DDP by parameter index."""
    if not saved or not saved.get("param_groups"):
        return
    by_name = any(isinstance(p, str) for g in saved["param_groups"] for p in g["params"])
    if by_name != sharded:
        was, now = ("FSDP", "without FSDP") if by_name else ("without FSDP", "under FSDP")
        raise UserError(
            f"{where} was written {was} but this run trains {now}; resume with the launch that wrote it "
            "(accelerate config / train.fsdp and several processes), or choose a new --out folder"
        )


def run(
    trainer: StepTrainer,
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    run: RunConfig,
    out: Path,
    config: dict[str, Any],
    desc: str,
    plot_keys: Sequence[str],
    eval_every: int | None = None,
    monitor: Callable[[list[dict[str, Any]], dict[str, Any]], list[str]] | None = None,
    grad_clip: float = 0.0,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> LoopResult:
    """Train ``trainer`` for ``run.steps`` steps (see the module docstring); writes OUT/metrics.jsonl,
    OUT/checkpoints/, OUT/curves.png (rank 0).

    ``monitor(history, record) -> [warning, ...]`` sees every step's record (all ranks' mean); each kind
    of warning (the text before ":") is raised once as :class:`TrainingWarning`, and every step's list is
    logged under ``warnings``. ``stop_after`` ends after that many steps without the final evaluation or
    plots (simulates a kill, for tests); the checkpoint cadence is unchanged.
    """
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    main = rank == 0
    model = trainer.model
    device = devices.resolve_device(run.device)
    devices.check_precision(run.precision, device)
    sharding = fsdp.fsdp_requested(run.fsdp) and dist.is_initialized()  # a launch joined the group
    if run.precision == "bf16":  # mixed precision: float32 master weights (fp32 trains the model as loaded)
        devices.keep_fp32_master_weights(model)
    full = fsdp.FullCopy(model, keep=main) if sharding else None
    model.to(device)
    if run.gradient_checkpointing:
        devices.enable_gradient_checkpointing(model)
    ckpt_dir = out / "checkpoints"
    start = 0
    saved_optimizer = None
    last_ckpt = common.find_last_checkpoint(ckpt_dir) if resume else None
    if last_ckpt is not None:
        check_resume_config(common.read_checkpoint_meta(last_ckpt)["config"], config, last_ckpt)
        info = common.load_checkpoint(last_ckpt, model=model, scheduler=scheduler)  # optimizer: below
        trainer.load_state(info["extra"])
        start, saved_optimizer = info["step"], info["optimizer"]
        check_optimizer_layout(saved_optimizer, sharded=sharding, where=last_ckpt)
    broadcast_weights(model)  # every rank starts from rank 0's weights, as DDP's wrapper ensures
    if sharding:
        fsdp.shard_model(model, optimizer)
        if saved_optimizer is not None:
            fsdp.load_full_optimizer_state(model, optimizer, saved_optimizer)
    elif saved_optimizer is not None:
        optimizer.load_state_dict(saved_optimizer)
    logger = common.MetricsLogger(out / "metrics.jsonl", resume_step=start if start else None, enabled=main)
    history = common.read_metrics(out / "metrics.jsonl") if monitor is not None else []
    bar = common.progress(run.steps, initial=start, desc=desc, enabled=main and show_progress)
    params = [p for p in model.parameters() if p.requires_grad]
    whole = [p for p in params if not sharding or not fsdp.is_dtensor(p)]
    clip = fsdp.clip_grad_norm if sharding else clip_grad_norm
    warned: set[str] = set()
    metrics: dict[str, Any] = {}
    record: dict[str, Any] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    step_time = 0.0
    done = start
    gathered = -1  # the step whose weights the FSDP copy holds
    model.train()
    for step in range(start, run.steps):
        ts = time.perf_counter()
        with devices.autocast(run.precision, device):
            batch = devices.to_device(trainer.batch(step), device)
        for _ in range(trainer.updates_per_step):
            with devices.autocast(run.precision, device):
                loss, step_metrics = trainer.loss(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            average_gradients(whole)  # FSDP reduce-scatters (and averages) the blocks' gradients itself
            grad_norm = clip(params, grad_clip)
            optimizer.step()
            trainer.after_update()
        scheduler.step()
        step_time += time.perf_counter() - ts
        done = step + 1
        stopping = stop_after is not None and stop_after <= done < run.steps  # a simulated kill
        bar.update(1)
        record = {}
        if monitor is not None or done % run.log_every == 0 or done == run.steps:
            record = {
                "step": done,
                **mean_over_ranks({"loss": loss.detach(), **step_metrics, **trainer.step_metrics()}, world),
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": grad_norm,
                "time_s": round(time.perf_counter() - t0, 3),
                "cpu_s": round(time.process_time() - c0, 3),
                "step_s": time.perf_counter() - ts,
            }
            if monitor is not None:
                alerts = monitor(history, record)
                for text in alerts:
                    if text.split(":", 1)[0] not in warned:
                        warned.add(text.split(":", 1)[0])
                        warnings.warn(text, TrainingWarning, stacklevel=2)
                if alerts:
                    record["warnings"] = alerts
                history.append(record)
            if not (done % run.log_every == 0 or done == run.steps):
                record = {}
        if eval_every is not None and (done % eval_every == 0 or done == run.steps) and not stopping:
            if full is not None:
                full.refresh(model)
                gathered = done
            metrics = _evaluate(trainer, full, device, run.precision, main=main)
            if main:
                record = {
                    "step": done,
                    **record,
                    **{f"eval/{k}": v for k, v in metrics.items() if k[0] != "_"},
                }
            common.barrier()
        if record:
            logger.log(record)
            shown = {
                k: record[k] for k in ("loss", *trainer.progress_keys) if isinstance(record.get(k), float)
            }
            bar.set_postfix({k.rsplit("/", 1)[-1]: f"{v:.4g}" for k, v in shown.items()})
        if done % run.checkpoint_every == 0 or done == run.steps:
            saved_model, opt_state = model, None
            if full is not None:  # every rank gathers; rank 0 writes the whole weights and optimizer state
                if gathered != done:
                    full.refresh(model)
                    gathered = done
                saved_model, opt_state = full.module, fsdp.full_optimizer_state(model, optimizer)
            if main:
                common.save_checkpoint(
                    ckpt_dir, step=done, model=saved_model, optimizer=optimizer, scheduler=scheduler,
                    config=config, extra=trainer.state(), keep_last=run.keep_last, optimizer_state=opt_state,
                )  # fmt: skip
            common.barrier()
        if stopping:
            break
    bar.close()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    stopped = stop_after is not None and stop_after <= done < run.steps
    final: torch.nn.Module | None = None if stopped else model
    if full is not None and not stopped:
        if gathered != done:
            full.refresh(model)
        final = full.module
    if eval_every is not None and start >= run.steps:  # a finished run was resumed: evaluate its weights
        metrics = _evaluate(trainer, full, device, run.precision, main=main)
    if main and not stopped:
        common.plot_metrics(
            common.read_metrics(out / "metrics.jsonl"), plot_keys, out / "curves.png", title=desc
        )
    last = record or (history[-1] if history else {})
    return LoopResult(
        step=done, seconds=seconds, cpu_seconds=cpu_seconds, step_seconds=step_time / max(1, done - start),
        last=last, metrics=metrics, stopped=stopped, model=final,
    )  # fmt: skip


def _evaluate(
    trainer: StepTrainer, full: fsdp.FullCopy | None, device: torch.device, precision: str, *, main: bool
) -> dict[str, Any]:
    """``trainer.evaluate()`` on rank 0 ({} elsewhere), under the run's autocast. Under FSDP rank 0
    evaluates the gathered copy (``full``, refreshed by the caller), moved to the device for the call."""
    if not main:
        return {}
    if full is None or full.module is None:
        with devices.autocast(precision, device):
            return trainer.evaluate()
    sharded = trainer.model
    trainer.model = full.module
    try:
        with devices.moved(full.module, device, torch.device("cpu")), devices.autocast(precision, device):
            return trainer.evaluate()
    finally:
        trainer.model = sharded


def clip_grad_norm(params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the global gradient norm to ``max_norm`` (0 = no clipping); the norm before clipping."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(grads, max_norm if max_norm > 0 else float("inf")))
