"""The ``perception`` stage of ``rl agent``: supervised single-turn reading (``rl.agent.perception``).

    result = run_perception(cfg, out / "perception", out / "init" / "model.pt")

Each step replays ``batch_size`` items through the real loop (no tools, no tool instructions: an item
is the image, the question and the answer, as the no-tool baseline is prompted) with the scripted
answer, and takes the SFT loss on the answer's tokens. The step's items are drawn from a fixed list with
a generator seeded from ``(cfg.seed, "perception", step)``, so a re-run gives the same weights. At the
end, :func:`reading_check` answers the tray and target items of further train notes greedily and
records accuracy per view and question kind (the train-split evidence that the policy reads).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mm.train.metrics import MetricsLogger, read_metrics
from rl.agent.backend import AgentBackend
from rl.agent.config import AgentRunConfig
from rl.agent.demos import scripted_policy
from rl.agent.loop import rollout
from rl.agent.parallel import check_in_sync, interleaved, is_writer, share, strided
from rl.agent.perception import perception_items, reading_score
from rl.agent.stages import (
    NO_TOOLS,
    build_backend,
    loop_config,
    optimizer_for,
    save_weights,
    sft_step,
    step_seed,
)
from rl.agent.task import AgentTask


def item_trajectories(backend: AgentBackend, cfg: AgentRunConfig, items: Sequence[AgentTask]):
    """``items`` replayed through the loop with their scripted answers (no tools, no instructions)."""
    turns = {t.task_id: [t.meta["reply"]] for t in items}
    return rollout(
        backend, items, loop_config(cfg, tools=False), registry=NO_TOOLS,
        policy=scripted_policy(backend, turns),
    )  # fmt: skip


def reading_check(backend: AgentBackend, cfg: AgentRunConfig, items: Sequence[AgentTask]) -> dict[str, Any]:
    """Greedy answers to ``items``: accuracy (:func:`reading_score`) per ``view/ask``, and the
    share of the most frequent answer per ``view/ask`` (a constant answer shows as 1.0). Under data
    parallel each rank answers every world-th item and every rank gets the whole result."""
    backend.adapter.model.eval()
    trajs = rollout(backend, strided(items), loop_config(cfg, tools=False), registry=NO_TOOLS)
    rows = [
        (f"{t.task.meta['view']}/{t.task.meta['ask']}", reading_score(t.task, t.answer or ""), t.answer or "")
        for t in trajs
    ]
    scores: dict[str, list[float]] = defaultdict(list)
    answers: dict[str, list[str]] = defaultdict(list)
    for key, score, answer in interleaved(rows):
        scores[key].append(score)
        answers[key].append(answer)
    out = {}
    for key in sorted(scores):
        top = max(answers[key].count(a) for a in set(answers[key]))
        out[key] = {
            "n": len(scores[key]),
            "accuracy": round(sum(scores[key]) / len(scores[key]), 3),
            "top_answer_share": round(top / len(answers[key]), 3),
        }
    return out


def run_perception(cfg: AgentRunConfig, stage_dir: Path, init: Path) -> dict[str, Any]:
    """The perception stage from ``init``; writes ``model.pt`` and ``metrics.jsonl`` (rank 0). Under data
    parallel each rank replays and trains on a contiguous share of every step's items (one process's step
    on the whole batch, as the SFT stages), and the reading check is shared out."""
    p = cfg.perception
    backend = build_backend(cfg, init)
    items = perception_items(cfg.world, p.notes, p.views, bare=cfg.data.bare_answers)
    optimizer = optimizer_for(backend, p.lr, p.weight_decay)
    log = MetricsLogger(stage_dir / "metrics.jsonl") if is_writer() else None
    backend.adapter.model.train()
    for step in range(1, p.steps + 1):
        gen = torch.Generator().manual_seed(step_seed(cfg, "perception", step))
        pick = torch.randint(len(items), (p.batch_size,), generator=gen).tolist()
        trajs = item_trajectories(backend, cfg, share([items[i] for i in pick]))
        seed = step_seed(cfg, "perception", step)
        loss, norm = sft_step(backend, optimizer, trajs, seed=seed, grad_clip=p.grad_clip, shared=True)
        if log is not None and (step % p.log_every == 0 or step == p.steps):
            log.log({"step": step, "loss": loss, "grad_norm": norm})
    check_in_sync(backend.adapter.model, "perception")
    result: dict[str, Any] = {"stage": "perception", "steps": p.steps, "items": len(items)}
    if p.check_notes:
        views = [v for v in p.views if v != "view"] or list(p.views)
        held = _check_items(cfg, views)
        result["reading_check"] = reading_check(backend, cfg, held)
    if not is_writer():
        return result
    save_weights(backend, stage_dir / "model.pt")
    if p.steps:
        result["final_loss"] = read_metrics(stage_dir / "metrics.jsonl")[-1]["loss"]
    return result


def _check_items(cfg: AgentRunConfig, views: Sequence[str]) -> list[AgentTask]:
    """Items of the ``check_notes`` train notes after the training ones (notes the stage never saw)."""
    from rl.agent.world_tasks import note_split

    index, seen = 0, 0
    while seen < cfg.perception.notes:  # the note index after the last training note
        seen += note_split(cfg.world, index) == "train"
        index += 1
    p = cfg.perception
    return perception_items(cfg.world, p.check_notes, views, bare=cfg.data.bare_answers, start=index)
