"""Batched multi-turn rollouts: the policy generates, tools answer, until an answer or a limit.

    backend = backend_for(load_adapter(folder))
    trajs = rollout(backend, tasks, LoopConfig(max_turns=4))
    batch, old_logps = trajectory_batch(backend, trajs)          # (B, T) model inputs + response_mask
    logps, mask = backend.adapter.token_logps(batch)            # one forward over the whole trajectories

Each round generates one turn for every unfinished trajectory (``batch_size`` at a time, left padded);
a turn ends at ``</tool>``, eos or its token budget. A tool call (``rl.agent.parse``) is run
(``rl.agent.tools``) and its observation — text, and for ``zoom`` a new image — is appended as
non-policy tokens; a malformed or failing call gets an error observation and the loop goes on. A turn
that ends with eos and no call is the answer, except in a simulated dialogue (``users``): there the
user simulator (``rl.agent.simulator``) judges each answer turn and its next message is appended as
non-policy tokens until it is satisfied or gives up. Finished trajectories leave the batch. Turn ids are kept
as generated (never decoded and re-encoded), so ``response_mask`` is 1 exactly on policy tokens and the
recorded log-probs are those of one forward over the concatenated ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rl.agent.backend import AgentBackend, Sampling, Turn, cut_turn
from rl.agent.parse import ParseError, is_call, parse_call
from rl.agent.simulator import SimulatorConfig, UserSimulator
from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS, Observation, ToolRegistry
from rl.agent.trajectory import CallRecord, Trajectory, UserTurn


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """Limits and generation settings of a rollout."""

    max_turns: int = 4
    """Most policy turns per trajectory; a tool call in the last one is not run (truncation max_turns)."""
    max_new_tokens: int = 64
    """Most tokens of one policy turn."""
    max_tokens: int = 256
    """Most policy tokens of a whole trajectory (observations not counted)."""
    max_length: int | None = None
    """Most ids of a whole trajectory, prompt and observations included (the model's context)."""
    batch_size: int = 8
    """Trajectories generated together in one batched turn."""
    sampling: Sampling = field(default_factory=Sampling)
    """Greedy or sampled turns (temperature, top-p)."""
    instructions: bool = True
    """Put the tool instructions (:func:`instructions`) before each question."""
    quote: dict[str, list[str]] = field(default_factory=dict)
    """Tool -> arguments whose values quote the user's words (:mod:`rl.agent.quote`); empty: none."""
    counts: bool = False
    """Number words in answers copy the counts of the tools' observations (:mod:`rl.agent.counts`)."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"LoopConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"LoopConfig.max_length must be >= 2 or None, got {self.max_length}")


IMAGES_CUT = ": the model takes at most "
"""Marks an observation whose images do not fit: "(images not shown: the model takes at most 8 images)"."""


def instructions(registry: ToolRegistry) -> str:
    """How to call tools, in the policy's prompt."""
    return (
        'To use a tool write <tool>{"name": ..., args}</tool>; boxes are [x0, y0, x1, y1] as fractions '
        f"of the image (0 to 1). Tools:\n{registry.describe()}\nWhen you know, answer in plain text.\n"
    )


def prompt_text(task: AgentTask, registry: ToolRegistry, cfg: LoopConfig) -> str:
    return (instructions(registry) if cfg.instructions else "") + task.question


Policy = Callable[[Sequence[Trajectory], int], list[Turn]]
"""Next turn of each trajectory, at most ``max_new_tokens`` ids each (default: the backend's model)."""


def rollout(
    backend: AgentBackend,
    tasks: Sequence[AgentTask],
    cfg: LoopConfig,
    *,
    registry: ToolRegistry | None = None,
    policy: Policy | None = None,
    users: SimulatorConfig | None = None,
) -> list[Trajectory]:
    """One trajectory per task (repeat a task in ``tasks`` for a group), in the order of ``tasks``.

    ``policy``: who writes the turns; None = the backend's model with ``cfg.sampling``
    (``rl.agent.demos.scripted_policy`` replays demonstrations through the same loop and tools).
    ``users``: simulate the user of every ``dialogue`` task (one :class:`UserSimulator` per trajectory,
    seed 0, the seed its opening question was written with); None = a dialogue ends at its first answer.
    """
    registry = registry if registry is not None else TOOLS
    if policy is None:

        def policy(trajs: Sequence[Trajectory], max_new_tokens: int) -> list[Turn]:
            quoting = {"quote": cfg.quote, "user_texts": [user_text(t) for t in trajs]} if cfg.quote else {}
            if cfg.counts:
                quoting["tool_texts"] = [tool_text(t) for t in trajs]
            return backend.generate(
                [t.segment for t in trajs], max_new_tokens=max_new_tokens, sampling=cfg.sampling, **quoting
            )

    trajs = [Trajectory.start(t, backend.prompt(t.sources, prompt_text(t, registry, cfg))) for t in tasks]
    sims = {
        id(t): UserSimulator(t.task, seed=0, cfg=users)
        for t in trajs
        if users is not None and t.task.kind == "dialogue"
    }
    active = [t for t in trajs if not _out_of_context(t, cfg)]
    while active:
        for i in range(0, len(active), cfg.batch_size):
            chunk = active[i : i + cfg.batch_size]
            budgets = [_budget(t, cfg) for t in chunk]
            turns = policy(chunk, max(budgets))
            for traj, turn, budget in zip(chunk, turns, budgets):
                step(traj, _fit(turn, budget, backend), backend, registry, cfg, sims.get(id(traj)))
        active = [t for t in active if not t.done and not _out_of_context(t, cfg)]
    return trajs


def user_text(traj: Trajectory) -> str:
    """What the user has written in ``traj``: the task's question and every later user message."""
    return "\n".join([traj.task.question, *(u.text for u in traj.user_turns if not u.done)])


def tool_text(traj: Trajectory) -> str:
    """What the tools have said in ``traj``: every observation's text."""
    return "\n".join(c.observation for c in traj.calls)


def _budget(traj: Trajectory, cfg: LoopConfig) -> int:
    budget = min(cfg.max_new_tokens, cfg.max_tokens - traj.policy_tokens)
    if cfg.max_length is not None:
        budget = min(budget, cfg.max_length - len(traj.ids))
    return budget


def _out_of_context(traj: Trajectory, cfg: LoopConfig) -> bool:
    if cfg.max_length is not None and len(traj.ids) >= cfg.max_length and not traj.done:
        traj.truncation = "context"
        return True
    return False


def _fit(turn: Turn, budget: int, backend: AgentBackend) -> Turn:
    """A row of a batched turn cut to its own budget (the batch ran to the largest one)."""
    if len(turn.ids) <= budget:
        return turn
    ids, stop = cut_turn(turn.ids[:budget], backend.eos_token_ids, backend.decode)
    return Turn(ids, turn.logps[: len(ids)], stop, backend.decode(ids))


def step(
    traj: Trajectory,
    turn: Turn,
    backend: AgentBackend,
    registry: ToolRegistry,
    cfg: LoopConfig,
    sim: UserSimulator | None = None,
) -> None:
    """Append one policy turn; run its tool call and append the observation, let the simulated user
    (``sim``) answer a reply, or finish the trajectory."""
    traj.add_policy(turn.ids, turn.logps, turn.text)
    n = len(traj.turns)
    calling = turn.stop == "tool" or (turn.stop == "eos" and is_call(turn.text))
    if not calling:
        if turn.stop == "eos" and sim is not None:
            _user_turn(traj, turn.text, sim, backend, cfg)
        elif turn.stop == "eos":
            traj.answer = turn.text.strip()
        elif traj.policy_tokens >= cfg.max_tokens:
            traj.truncation = "max_tokens"
        elif cfg.max_length is not None and len(traj.ids) >= cfg.max_length:
            traj.truncation = "context"
        else:
            traj.truncation = "turn_tokens"
        return
    call = parse_call(turn.text, registry, n_images=len(traj.task.sources))
    if n >= cfg.max_turns:
        traj.calls.append(CallRecord(n, call, "(not run: no turns left)"))
        traj.truncation = "max_turns"
        return
    obs = Observation(call.observation) if isinstance(call, ParseError) else registry.run(call, traj.task)
    text, images, labels = obs.text, obs.images, obs.labels
    room = backend.max_images
    if images and room is not None and len(traj.images) + len(images) > room:
        shown = "image not shown" if len(images) == 1 else "images not shown"
        text, images, labels = f"{text} ({shown}{IMAGES_CUT}{room} images)", (), ()
    traj.calls.append(CallRecord(n, call, text, image_added=bool(images)))
    traj.add_observation(backend.observation(text, images, labels))
    if traj.policy_tokens >= cfg.max_tokens:
        traj.truncation = "max_tokens"


def _user_turn(
    traj: Trajectory, text: str, sim: UserSimulator, backend: AgentBackend, cfg: LoopConfig
) -> None:
    """The simulated user judges a reply; the dialogue ends (satisfied or not) or its message follows."""
    reply = sim.reply(text)
    n = len(traj.turns)
    traj.user_turns.append(UserTurn(n, reply.text, reply.score, reply.done))
    if reply.done:
        traj.answer, traj.satisfied = text.strip(), reply.satisfied
        return
    traj.satisfied = False
    if n >= cfg.max_turns:
        traj.truncation = "max_turns"
    elif traj.policy_tokens >= cfg.max_tokens:
        traj.truncation = "max_tokens"
    else:
        traj.add_observation(backend.user_message(reply.text))


def trajectory_batch(
    backend: AgentBackend, trajs: Sequence[Trajectory]
) -> tuple[dict[str, Any], torch.Tensor]:
    """Model inputs (B, T) of whole trajectories with ``response_mask`` (B, T), and the sampling-time
    log-probs (B, T) aligned with them (0 off the policy tokens); left padded."""
    batch = backend.model_inputs([t.segment for t in trajs], [t.response_mask for t in trajs])
    T = batch["input_ids"].shape[1]
    old = torch.zeros(len(trajs), T, dtype=torch.float32)
    for b, t in enumerate(trajs):
        old[b, T - len(t.logps) :] = torch.tensor(t.logps, dtype=torch.float32)
    return batch, old.to(batch["input_ids"].device)


def trajectory_counts(t: Trajectory) -> dict[str, Any]:
    """What :func:`summary` reads of a trajectory (small: what data-parallel ranks gather)."""
    return {
        "turns": len(t.turns), "answered": t.answer is not None, "calls": len(t.calls),
        "valid": t.n_valid_calls, "satisfied": t.satisfied, "truncation": t.truncation,
    }  # fmt: skip


def summary(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Counts over trajectories: answered, truncations, calls and the valid-call rate, mean turns."""
    return summarise([trajectory_counts(t) for t in trajs])


def summarise(counts: Sequence[dict[str, Any]]) -> dict[str, float]:
    """:func:`summary` of trajectories' :func:`trajectory_counts`."""
    calls = sum(c["calls"] for c in counts)
    out = {
        "trajectories": float(len(counts)),
        "answered": float(sum(c["answered"] for c in counts)),
        "mean_turns": sum(c["turns"] for c in counts) / max(len(counts), 1),
        "tool_calls": float(calls),
        "valid_call_rate": sum(c["valid"] for c in counts) / calls if calls else float("nan"),
    }
    dialogues = [c for c in counts if c["satisfied"] is not None]
    if dialogues:
        out["goal_reached"] = sum(bool(c["satisfied"]) for c in dialogues) / len(dialogues)
    for reason in ("max_turns", "max_tokens", "turn_tokens", "context"):
        out[f"truncated_{reason}"] = float(sum(c["truncation"] == reason for c in counts))
    return out
