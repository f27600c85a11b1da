"""Tool-use demonstrations: scripted turns replayed through the real loop, tools and tokenisation.

    turns = {task.task_id: demo_turns(task) for task in tasks}
    demos = rollout(backend, tasks, cfg, policy=scripted_policy(backend, turns))   # SFT cold start data

A demonstration is the list of a task's policy turns as text (``rl.agent.world_demos.policy_turns``
for world tasks, :func:`demo_turns` for user tasks with normalised boxes); the loop runs its tool calls
for real, so observations (and zoom images) are exactly what the policy will see at rollout time, and
``response_mask`` keeps them out of the SFT loss.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from rl.agent.backend import AgentBackend, Turn, cut_turn
from rl.agent.parse import TOOL_CLOSE, TOOL_OPEN
from rl.agent.task import AgentTask
from rl.agent.trajectory import Trajectory


def tool_text(name: str, **args: object) -> str:
    """A tool call as the policy writes it: ``<tool>{"name": ..., args}</tool>``."""
    return f"{TOOL_OPEN}{json.dumps({'name': name, **args})}{TOOL_CLOSE}"


def demo_turns(task: AgentTask) -> list[str]:
    """A generic demonstration for user tasks: "change" tasks compare images 1 and 2, tasks with
    ``meta["box"]`` (NORMALISED [0, 1], as the parser's boxes) zoom there (image ``meta.get("image", 1)``),
    then the task's answer. World tasks keep source-pixel boxes in their meta: use
    ``rl.agent.world_demos.policy_turns(demonstration(task))`` for them."""
    turns = []
    if task.kind == "change" and len(task.sources) >= 2:
        turns.append(tool_text("compare", images=[1, 2]))
    if "box" in task.meta:
        box = [round(float(v), 3) for v in task.meta["box"]]
        turns.append(tool_text("zoom", image=int(task.meta.get("image", 1)), box=box))
    return [*turns, task.answer]


def scripted_policy(backend: AgentBackend, turns: Mapping[str, Sequence[str]]):
    """A :data:`rl.agent.loop.Policy` writing ``turns[task_id][k]`` as turn k (the last one repeats).

    Each turn is tokenised on its own (as a generated turn starts a fresh stretch of ids), eos appended
    unless it ends a tool call, and cut to the turn budget as generated turns are; log-probs are 0.
    """
    missing = object()

    def policy(trajs: Sequence[Trajectory], max_new_tokens: int) -> list[Turn]:
        out = []
        for traj in trajs:
            lines = turns.get(traj.task.task_id, missing)
            if lines is missing or not lines:
                raise KeyError(f"no demonstration turns for task {traj.task.task_id!r}")
            line = lines[min(len(traj.turns), len(lines) - 1)]
            ids = backend.text_ids(line)
            if not line.endswith(TOOL_CLOSE):
                ids.append(backend.eos_token_ids[0])
            ids, stop = cut_turn(ids[:max_new_tokens], backend.eos_token_ids, backend.decode)
            out.append(Turn(ids, [0.0] * len(ids), stop, backend.decode(ids)))
        return out

    return policy
