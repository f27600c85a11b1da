"""Held-out eval of ``rl agent``: greedy rollouts on the test split (or a task file), per-task rows, metrics
with intervals.

    rows, shown = eval_model(backend, cfg, tools=True)        # one row per test task (rl.agent.scoring)
    metrics = summarise(rows, n_boot=1000)                      # {name: Interval.to_json()}

Metrics (each a ratio of per-task sums, so :func:`mm.eval.bootstrap.ratio_interval` resamples tasks):
``accuracy/<kind>`` (score 1), ``score/<kind>`` (mean score), ``caption/attribute_hallucination`` and
``caption/count_hallucination`` (false claims / judged claims of that kind; undefined when no claim of
the kind is made, so ``caption/<kind>_claims_per_caption`` and ``_false_per_caption`` are given too),
``valid_call_rate``
(valid / all tool calls), ``goal_reached`` (dialogues whose simulated user ended satisfied),
``zoom_on_target/<kind>`` (tasks whose first tool call zooms where the answer is,
:func:`rl.agent.scoring.zoom_on_target`; detail and caption tasks).
:func:`paired_gains` gives the paired interval of a metric's change between two models on the same tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mm.eval.bootstrap import paired_change_interval, ratio_interval
from rl.agent.backend import AgentBackend
from rl.agent.config import AgentRunConfig
from rl.agent.loop import rollout
from rl.agent.parallel import interleaved, strided
from rl.agent.scoring import HALLUCINATION_KINDS, eval_row
from rl.agent.stages import NO_TOOLS, loop_config
from rl.agent.task import AgentTask
from rl.agent.task_file import count_tasks, data_tasks
from rl.agent.tools import TOOLS, prepare_tool_modules
from rl.agent.world_tasks import WorldTaskConfig, world_tasks


def heldout_tasks(cfg: AgentRunConfig, seed: int) -> list:
    """``eval.tasks_per_kind`` tasks of each kind of world ``seed`` (the training world's settings), from
    the ``eval.split`` notes (test unless a train-split check asks otherwise) from ``eval.start`` on."""
    from dataclasses import replace

    world: WorldTaskConfig = replace(cfg.world, seed=seed)
    e = cfg.eval
    return [
        t for kind in cfg.data.kinds for t in world_tasks(world, kind, e.split, e.tasks_per_kind, e.start)
    ]


def eval_sets(cfg: AgentRunConfig) -> list[tuple[int, list[AgentTask]]]:
    """(seed, tasks) of the eval: every task of ``eval.file`` (seed 0 in its rows), or each eval seed's
    :func:`heldout_tasks`."""
    if cfg.eval.file is not None:
        return [(0, data_tasks(cfg.eval.file, cfg.data))]
    return [(seed, heldout_tasks(cfg, seed)) for seed in cfg.eval.seeds]


def eval_size(cfg: AgentRunConfig) -> int:
    """How many rows a model's eval gives (the task file's tasks are counted without reading images)."""
    if cfg.eval.file is not None:
        return count_tasks(cfg.eval.file)
    return len(cfg.eval.seeds) * cfg.eval.tasks_per_kind * len(cfg.data.kinds)


def eval_model(
    backend: AgentBackend, cfg: AgentRunConfig, *, tools: bool, transcripts: int = 0
) -> tuple[list[dict[str, Any]], list[str]]:
    """Greedy rollouts of every eval task (:func:`eval_sets`): rows in task order, and the transcripts of the
    first ``transcripts`` trajectories of each kind. Under data parallel each rank rolls out every
    world-th task (:mod:`rl.agent.parallel`) and every rank gets all the rows, in task order."""
    rows, shown, seen = [], [], {}
    loop = loop_config(cfg, tools=tools)
    for seed, tasks in eval_sets(cfg):
        wanted = set()  # the first ``transcripts`` tasks of each kind (over the sets): only theirs are made
        for k, task in enumerate(tasks):
            if seen.get(task.kind, 0) < transcripts:
                seen[task.kind] = seen.get(task.kind, 0) + 1
                wanted.add(k)
        if tools:
            prepare_tool_modules(cfg.tool_modules, tasks)
        mine = strided(list(range(len(tasks))))
        out = rollout(
            backend,
            [tasks[k] for k in mine],
            loop,
            registry=TOOLS if tools else NO_TOOLS,
            users=cfg.rollout.simulator(),
        )
        local = [(eval_row(t, seed), t.transcript() if k in wanted else None) for k, t in zip(mine, out)]
        for row, text in interleaved(local):
            rows.append(row)
            if text is not None:
                shown.append(text)
    return rows, shown


def metric_units(rows: Sequence[dict[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each metric as (numerator, denominator) per row (rows outside a metric's kind have 0 / 0)."""

    def col(name: str, when=lambda r: True) -> np.ndarray:
        return np.array([float(r.get(name, 0.0)) if when(r) else 0.0 for r in rows])

    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for kind in sorted({r["kind"] for r in rows}):
        of = lambda r, k=kind: r["kind"] == k  # noqa: E731
        out[f"accuracy/{kind}"] = (col("correct", of), np.array([float(of(r)) for r in rows]))
        out[f"score/{kind}"] = (col("score", of), np.array([float(of(r)) for r in rows]))
        aimed = lambda r, k=kind: r["kind"] == k and "zoom_on_target" in r  # noqa: E731
        aim = (col("zoom_on_target", aimed), np.array([float(aimed(r)) for r in rows]))
        out[f"zoom_on_target/{kind}"] = aim
    captions = np.array([float(r["kind"] == "caption") for r in rows])
    for k in HALLUCINATION_KINDS:
        out[f"caption/{k}_hallucination"] = (col(f"{k}_hallucinated"), col(f"{k}_judged"))
        out[f"caption/{k}_claims_per_caption"] = (col(f"{k}_judged"), captions)
        out[f"caption/{k}_false_per_caption"] = (col(f"{k}_hallucinated"), captions)
    out["valid_call_rate"] = (col("valid_calls"), col("calls"))
    out["calls_per_task"] = (col("calls"), np.ones(len(rows)))
    out["goal_reached"] = (col("goal_reached"), np.array([float("goal_reached" in r) for r in rows]))
    return out


def summarise(rows: Sequence[dict[str, Any]], *, n_boot: int) -> dict[str, dict[str, Any]]:
    """Every metric of :func:`metric_units` with its bootstrap 95% interval (None where undefined)."""
    return {
        name: ratio_interval(num, den, n_boot=n_boot).to_json()
        for name, (num, den) in metric_units(rows).items()
        if den.sum() > 0
    }


def paired_gains(
    before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], names: Sequence[str], *, n_boot: int
) -> dict[str, dict[str, Any]]:
    """``after - before`` (absolute) of each metric with a paired interval; rows aligned task by task."""
    if [r["task_id"] for r in before] != [r["task_id"] for r in after]:
        raise ValueError("paired gains need the same tasks in the same order for both models")
    b, a = metric_units(before), metric_units(after)
    return {
        n: paired_change_interval(b[n], a[n], relative=False, n_boot=n_boot).to_json()
        for n in names
        if n in a and n in b and b[n][1].sum() > 0 and a[n][1].sum() > 0
    }
