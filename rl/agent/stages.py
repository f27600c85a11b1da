"""The training stages of ``rl agent``: policy init, SFT on replayed demonstrations, multi-turn GRPO.

Every stage is a pure function of the config and the stage it starts from, and reseeds torch from
``(cfg.seed, stage, step)`` before each step, so a stage re-run (or resumed from its checkpoint) gives
the same weights and metrics. Weights travel between stages as ``state_dict`` files (``model.pt``).

Tasks come from the world, or from a user's task file (``data.file``, ``rl.agent.task_file``), whose own
demonstration calls the tool SFT replays.

- tool SFT (cold start): world demonstrations (``rl.agent.world_demos``) replayed through the real loop
  and tools by ``rl.agent.demos.scripted_policy``; the loss is on policy turns only (observations and
  the simulated user's messages are masked by ``response_mask``).
- no-tool SFT: the same tasks' answers only (no tool instructions, an empty tool registry), same steps
  and batch: the same-size, same-budget baseline.
- GRPO: ``tasks_per_step`` train tasks x ``group_size`` sampled trajectories, rewarded by
  ``rl.agent.scoring.trajectory_reward``, one clipped policy-gradient step on policy tokens
  (``rl.agent.train.grpo_loss``). Dialogues are driven by the user simulator.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from mm.train.config import OptimConfig, lr_lambda
from mm.train.devices import enable_gradient_checkpointing, resolve_device
from mm.train.loop import average_gradients
from mm.train.metrics import MetricsLogger, read_metrics
from rl.agent.backend import AgentBackend, Sampling, backend_for
from rl.agent.config import AgentRunConfig, SFTConfig
from rl.agent.demos import scripted_policy
from rl.agent.loop import IMAGES_CUT, LoopConfig, rollout, summarise, summary, trajectory_counts
from rl.agent.micro import grpo_backward, sft_backward
from rl.agent.parallel import barrier, check_in_sync, gathered, is_writer, rank_world, share
from rl.agent.policy_init import INDEX_WEIGHT, load_policy
from rl.agent.scoring import trajectory_reward
from rl.agent.task import AgentTask
from rl.agent.task_file import data_tasks
from rl.agent.tools import TOOLS, ToolRegistry, prepare_tool_modules
from rl.agent.train import AgentGRPOConfig
from rl.agent.trajectory import Trajectory
from rl.agent.weights import load_policy_state, policy_state
from rl.agent.world_demos import answer_turns, demonstration, policy_turns, unlearned
from rl.agent.world_tasks import mixed_tasks

NO_TOOLS = ToolRegistry()
"""The no-tool baseline's registry: any call it writes is an unknown tool."""


def step_seed(cfg: AgentRunConfig, stage: str, step: int) -> int:
    """The torch seed of one step of one stage."""
    return zlib.crc32(f"{cfg.seed}/{stage}/{step}".encode())


def build_backend(cfg: AgentRunConfig, weights: Path | None = None) -> AgentBackend:
    """The policy of ``cfg.policy`` behind its agent backend: on ``policy.device`` in ``policy.dtype``, with
    LoRA adapters when ``lora.enabled`` (seeded by ``policy.seed``), and ``weights`` (a stage's
    ``model.pt``, :mod:`rl.agent.weights`) loaded."""
    p = cfg.policy
    dtype = None if p.dtype == "auto" else getattr(torch, p.dtype)
    device = resolve_device(p.device, key="policy.device")
    if p.init is not None:
        adapter = load_policy(p.init, list(p.overrides), seed=p.seed, dtype=dtype)
    else:
        from mm.model.adapter.notevlm import NoteVLMAdapter
        from mm.model.factory import build_notevlm, load_notevlm_spec

        spec = load_notevlm_spec(p.spec, list(p.overrides))
        torch.manual_seed(p.seed)
        model, processor = build_notevlm(spec)
        adapter = NoteVLMAdapter(model=model.to(dtype=dtype) if dtype else model, processor=processor)
    adapter.model.to(device)
    if cfg.lora.enabled:
        torch.manual_seed(p.seed)  # the adapters' init: every stage builds the same ones
        lo = cfg.lora
        adapter.apply_lora(r=lo.r, alpha=lo.alpha, dropout=lo.dropout, target_modules=lo.target_modules)
        for name, param in adapter.model.named_parameters():  # fresh index rows (policy.overrides) train
            if name.endswith(INDEX_WEIGHT.removeprefix("model.")):
                param.requires_grad_(True)
    if weights is not None:
        load_policy_state(adapter.model, torch.load(weights, map_location="cpu", weights_only=True))
    if p.gradient_checkpointing:
        enable_gradient_checkpointing(adapter.model)
    if adapter.family == "notevlm":
        check_context(adapter.base_model.config, cfg.rollout.max_length)
    return backend_for(adapter)


def check_context(config: Any, max_length: int | None) -> None:
    """A UserError when a trajectory of ``rollout.max_length`` ids is past the NoteVLM's positions (None:
    no limit, not checked)."""
    positions = int(config.text_config.max_position_embeddings)
    if max_length is not None and max_length > positions:
        raise UserError(
            f"rollout.max_length={max_length} does not fit the policy's {positions} positions "
            f"(max_position_embeddings); set rollout.max_length <= {positions}, or add max_length="
            f"{max_length} to policy.overrides to raise them"
        )


def loop_config(cfg: AgentRunConfig, *, tools: bool, sample: bool = False) -> LoopConfig:
    r = cfg.rollout
    sampling = (
        Sampling(do_sample=True, temperature=cfg.grpo.temperature, top_p=cfg.grpo.top_p)
        if sample
        else Sampling()
    )
    return LoopConfig(
        max_turns=r.max_turns, max_new_tokens=r.max_new_tokens, max_tokens=r.max_tokens,
        max_length=r.max_length, batch_size=r.batch_size, sampling=sampling, instructions=tools,
        quote=cfg.decode.quote if tools else {}, counts=cfg.decode.counts and tools,
    )  # fmt: skip


_RENDERED: dict[str, tuple[AgentTask, ...]] = {}
"""The last world task set :func:`train_tasks` rendered, by its settings: the SFT stages and GRPO of one run
train on the same tasks, which take seconds per thousand to render (one set is kept, to bound memory)."""


def train_tasks(cfg: AgentRunConfig) -> list[AgentTask]:
    """The tasks of ``data.file`` (``rl.agent.task_file``), or ``data.train_tasks`` world tasks (rendered
    once per process for the same world and mix; the stages never change a task)."""
    d = cfg.data
    if d.file is not None:
        return data_tasks(d.file, d)
    kinds = tuple(d.mix or d.kinds)
    key = repr((cfg.world, d.train_tasks, kinds))
    if key not in _RENDERED:
        _RENDERED.clear()
        tasks = tuple(mixed_tasks(cfg.world, "train", d.train_tasks, kinds))
        for task in tasks:  # shared by the stages: a tool drawing into a photo would change the next one
            for image in task.sources:
                image.flags.writeable = False
        _RENDERED[key] = tasks
    return list(_RENDERED[key])


def recovers(task: AgentTask, share: float) -> bool:
    """Whether ``task``'s demonstration is a recovery one (``data.dialogue_recovery``): drawn from its id."""
    return task.kind == "dialogue" and zlib.crc32(task.task_id.encode()) % 10_000 < round(share * 10_000)


def demo_trajectories(backend: AgentBackend, cfg: AgentRunConfig, tasks: Sequence[AgentTask], *, tools: bool):
    """Demonstrations replayed through the loop: with tool calls (``tools``) or answers only; a recovery
    demonstration's mistake turns are taken out of the loss (``Trajectory.mask_turns``)."""
    pick = policy_turns if tools else answer_turns
    d = cfg.data
    demos = {
        t.task_id: demonstration(
            t,
            detail_zoom=d.detail_zoom,
            caption_zoom=d.caption_zoom,
            change_zoom=d.change_zoom,
            dialogue_zoom=d.dialogue_zoom,
            bare_answers=d.bare_answers,
            detail_reasoning=d.detail_reasoning,
            recovery=recovers(t, d.dialogue_recovery),
            user=cfg.rollout.simulator(),
        )
        for t in tasks
    }
    trajs = rollout(
        backend, tasks, loop_config(cfg, tools=tools), registry=TOOLS if tools else NO_TOOLS,
        policy=scripted_policy(backend, {k: pick(v) for k, v in demos.items()}),
        users=cfg.rollout.simulator(),
    )  # fmt: skip
    for traj in trajs:
        masked = unlearned(demos[traj.task.task_id], tools=tools)
        if masked:
            traj.mask_turns(masked)
    warn_cut(trajs)
    return trajs


def warn_cut(trajs: Sequence[Trajectory]) -> None:
    """A warning when demonstrations would be learned cut: a turn past ``rollout.max_new_tokens``, the
    trajectory past ``rollout.max_length``, or an observation's images past the policy's ``max_images``
    (fine for a smoke run's small budgets; a real run should raise the budget the warning names)."""
    cut = {
        "a turn longer than rollout.max_new_tokens": sum(t.truncation == "turn_tokens" for t in trajs),
        "longer than rollout.max_length (raise it, and max_length in policy.overrides)": sum(
            t.truncation == "context" for t in trajs
        ),
        "images beyond max_images (raise it in policy.overrides)": sum(
            any(IMAGES_CUT in c.observation for c in t.calls) for t in trajs
        ),
    }
    for what, n in cut.items():
        if n:
            warnings.warn(
                f"{n} of {len(trajs)} demonstrations are cut: {what}; they are learned as cut", stacklevel=2
            )


def clip_grads(backend: AgentBackend, limit: float) -> float:
    """Average the gradients over data-parallel ranks (none alone), clip their global norm; the norm."""
    params = [p for p in backend.adapter.model.parameters() if p.requires_grad]
    average_gradients(params)
    norm = torch.nn.utils.clip_grad_norm_(params, limit if limit > 0 else float("inf"))
    return float(norm)


def sft_step(
    backend: AgentBackend,
    optimizer: torch.optim.Optimizer,
    trajs: Sequence[Trajectory],
    *,
    seed: int,
    grad_clip: float,
    call_weight: float = 1.0,
    micro: int = 0,
    shared: bool = False,
) -> tuple[float, float]:
    """One supervised step on the policy turns of ``trajs`` (the global batch: under data parallel this rank
    takes its share, :mod:`rl.agent.parallel`; ``shared``: ``trajs`` is this rank's share already), torch
    seeded with ``seed``, ``micro`` trajectories a forward (:mod:`rl.agent.micro`; 0 = all): (loss, grad
    norm)."""
    torch.manual_seed(seed)
    optimizer.zero_grad(set_to_none=True)
    mine = trajs if shared else share(trajs)
    loss = sft_backward(backend, mine, call_weight=call_weight, micro=micro)
    norm = clip_grads(backend, grad_clip)
    optimizer.step()
    return loss, norm


def optimizer_for(backend: AgentBackend, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    params = [p for p in backend.adapter.model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def sft_schedule(optimizer: torch.optim.Optimizer, s: SFTConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """``sft.schedule``'s learning rate: a multiplier of ``sft.lr`` per step (1 throughout for ``constant``;
    for ``cosine`` :func:`mm.train.config.lr_lambda`'s warm-up and cosine decay, to 0)."""
    if s.schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    shape = OptimConfig(lr=s.lr, warmup_steps=s.warmup_steps, min_lr_ratio=0.0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(shape, s.steps))


def save_weights(backend: AgentBackend, path: Path) -> None:
    """What a stage keeps of the policy (:func:`rl.agent.weights.policy_state`), written atomically."""
    tmp = path.with_suffix(".tmp")
    torch.save(policy_state(backend.adapter.model), tmp)
    tmp.replace(path)


def run_sft(cfg: AgentRunConfig, stage_dir: Path, init: Path, *, tools: bool, stage: str) -> dict[str, Any]:
    """SFT on replayed demonstrations (tool or no-tool); writes ``model.pt`` and ``metrics.jsonl``."""
    backend = build_backend(cfg, init)
    tasks = train_tasks(cfg)
    if tools:
        prepare_tool_modules(cfg.tool_modules, tasks)
    demos = demo_trajectories(backend, cfg, tasks, tools=tools)
    s = cfg.sft
    optimizer = optimizer_for(backend, s.lr, s.weight_decay)
    scheduler = sft_schedule(optimizer, s)
    log = MetricsLogger(stage_dir / "metrics.jsonl") if is_writer() else None
    backend.adapter.model.train()
    order: list[int] = []
    lead = [i for i, d in enumerate(demos) if d.task.kind in s.lead_kinds]
    if s.lead_steps and not lead:
        raise UserError(f"sft.lead_kinds {s.lead_kinds}: no training task of these kinds to lead with")
    for step in range(1, s.steps + 1):
        gen = torch.Generator().manual_seed(step_seed(cfg, stage, step))
        if step == s.lead_steps + 1:
            order = []  # the lead is over: every task from here on
        pool = lead if step <= s.lead_steps else range(len(demos))
        if len(order) < s.batch_size:
            order += [pool[i] for i in torch.randperm(len(pool), generator=gen).tolist()]
        batch, order = [demos[i] for i in order[: s.batch_size]], order[s.batch_size :]
        seed = step_seed(cfg, stage, step)
        loss, norm = sft_step(
            backend,
            optimizer,
            batch,
            seed=seed,
            grad_clip=s.grad_clip,
            call_weight=s.call_weight,
            micro=s.micro_batch_size,
        )
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        if log is not None and (step % s.log_every == 0 or step == s.steps):
            log.log({"step": step, "loss": loss, "grad_norm": norm, "lr": lr})
    check_in_sync(backend.adapter.model, stage)
    if not is_writer():
        return {"stage": stage}
    save_weights(backend, stage_dir / "model.pt")
    demo_stats = summary(demos)
    return {"stage": stage, "steps": s.steps, "demos": len(demos), "demo_summary": demo_stats,
            "final_loss": read_metrics(stage_dir / "metrics.jsonl")[-1]["loss"]}  # fmt: skip


def reward_fn(cfg: AgentRunConfig) -> Callable[[Trajectory], float]:
    g = cfg.grpo

    def reward(traj: Trajectory) -> float:
        return trajectory_reward(
            traj, invalid_call_penalty=g.invalid_call_penalty, hallucination_weight=g.hallucination_weight,
            turn_reward_weight=g.turn_reward_weight, truncation_penalty=g.truncation_penalty,
            zoom_reward_weight=g.zoom_reward_weight, count_weight=g.count_weight,
        )  # fmt: skip

    return reward


def step_rollout(
    cfg: AgentRunConfig,
    backend: AgentBackend,
    tasks: Sequence[AgentTask],
    loop: LoopConfig,
    *,
    stage: str,
    step: int,
    tasks_per_step: int,
    per_task: int,
) -> list[Trajectory]:
    """The sampled trajectories of one RL step: the next ``tasks_per_step`` train tasks in order (cycling),
    each ``per_task`` times in a row, torch seeded from ``(seed, stage, step)``; dialogues with the user
    simulator. Under data parallel, this rank's share of the tasks, seeded with its rank added."""
    chosen = share(step_tasks(tasks, step, tasks_per_step))
    torch.manual_seed(step_seed(cfg, stage, step) + rank_world()[0])
    return rollout(backend, [t for t in chosen for _ in range(per_task)], loop, users=cfg.rollout.simulator())


def step_tasks(tasks: Sequence[AgentTask], step: int, tasks_per_step: int) -> list[AgentTask]:
    """The tasks of one RL step: the next ``tasks_per_step`` of ``tasks`` in order, cycling."""
    first = (step - 1) * tasks_per_step
    return [tasks[(first + i) % len(tasks)] for i in range(tasks_per_step)]


def prepare_steps(cfg: AgentRunConfig, tasks: Sequence[AgentTask], steps: range, tasks_per_step: int) -> None:
    """The tool modules prepared for the tasks ``steps`` of an RL stage roll out, each task once."""
    chosen = {id(t): t for step in steps for t in step_tasks(tasks, step, tasks_per_step)}
    prepare_tool_modules(cfg.tool_modules, list(chosen.values()))


def rollout_summary(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """:func:`rl.agent.loop.summary` of every rank's trajectories (a collective under data parallel)."""
    if rank_world()[1] == 1:
        return summary(trajs)
    return summarise(gathered([trajectory_counts(t) for t in trajs]))


def run_grpo(
    cfg: AgentRunConfig, stage_dir: Path, init: Path, *, stop_after: int | None = None
) -> dict[str, Any] | None:
    """Multi-turn GRPO from ``init``; resumes from ``stage_dir/checkpoint.pt``. ``stop_after``: stop (as
    an interrupted run would) once that step's checkpoint is written, and return None."""
    g = cfg.grpo
    backend = build_backend(cfg, init)
    optimizer = optimizer_for(backend, g.lr)
    ckpt = stage_dir / "checkpoint.pt"
    start = load_checkpoint(ckpt, optimizer, {"model": backend.adapter.model})
    log = (
        MetricsLogger(stage_dir / "metrics.jsonl", resume_step=start if start else None)
        if is_writer()
        else None
    )
    tasks = train_tasks(cfg)
    algo = AgentGRPOConfig(
        group_size=g.group_size, scale=g.scale, eps_low=g.eps_low, eps_high=g.eps_high, agg=g.agg,
        turn_credit=g.turn_credit,
    )  # fmt: skip
    loop = loop_config(cfg, tools=True, sample=True)
    reward = reward_fn(cfg)
    prepare_steps(cfg, tasks, range(start + 1, g.steps + 1), g.tasks_per_step)
    backend.adapter.model.train()
    for step in range(start + 1, g.steps + 1):
        trajs = step_rollout(
            cfg, backend, tasks, loop, stage="grpo", step=step, tasks_per_step=g.tasks_per_step,
            per_task=g.group_size,
        )  # fmt: skip
        rewards = torch.tensor([reward(t) for t in trajs], dtype=torch.float32)  # (B,)
        optimizer.zero_grad(set_to_none=True)
        loss, metrics = grpo_backward(
            backend, trajs, rewards, algo, temperature=g.temperature, micro=g.micro_batch_size
        )
        norm = clip_grads(backend, g.grad_clip)
        optimizer.step()
        counts = rollout_summary(trajs)
        if log is not None:
            log.log({"step": step, "loss": loss, "grad_norm": norm} | metrics | counts)
        if step % g.checkpoint_every == 0 or step == g.steps:
            if is_writer():
                save_checkpoint(ckpt, step, optimizer, {"model": backend.adapter.model})
            barrier()
            if stop_after is not None and step >= stop_after:
                return None
    check_in_sync(backend.adapter.model, "grpo")
    if not is_writer():
        return {"stage": "grpo"}
    save_weights(backend, stage_dir / "model.pt")
    records = read_metrics(stage_dir / "metrics.jsonl")
    return {"stage": "grpo", "steps": g.steps, "last": records[-1] if records else None}


def save_checkpoint(
    path: Path, step: int, optimizer: torch.optim.Optimizer, modules: dict[str, torch.nn.Module]
) -> None:
    """``modules``' states (:func:`rl.agent.weights.policy_state`), the optimizer's and ``step`` in one file,
    written atomically."""
    tmp = path.with_suffix(".tmp")
    state = {name: policy_state(m) for name, m in modules.items()}
    torch.save(state | {"optimizer": optimizer.state_dict(), "step": step}, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path, optimizer: torch.optim.Optimizer, modules: dict[str, torch.nn.Module]) -> int:
    """Load a :func:`save_checkpoint` file into ``modules`` and ``optimizer``; its step (0: no file)."""
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    for name, m in modules.items():
        load_policy_state(m, state[name])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])
