"""The ``note_model`` stage of ``rl agent``: a note model trained on the task world's photos, then the policy
starts from it, so one command runs the whole recipe.

    rl agent --config configs/rl/agent_world.yaml --out runs/agent --set note_model.build=true

Sub-stages, each in ``OUT/note_model/<name>/`` and skipped on a re-run once its ``done.json`` exists (a
stopped pretraining or SFT resumes from its own checkpoints):

1. ``data``: :func:`rl.agent.world_export.export_world` of ``note_model.notes`` notes of ``world`` (so the
   held-out split the agent is evaluated on stays unseen);
2. ``pretrain``: InfoNCE (``mm pretrain``'s library call) on that folder;
3. ``align``, ``sft``, ``tune``, then ``phase1``, ``phase2`` ... (``note_model.phases``): ``mm train``
   stages, each from the one before; the policy starts from the last (``sft`` without a ``tune`` config or
   phases).

Under ``torchrun`` the training sub-stages are data parallel (their trainers'); rank 0 alone exports the
photos and writes each ``done.json``, and every rank starts a sub-stage after the one before has finished.

The stage configs are the ``note_model`` StageSpecs (a YAML of the ``mm`` CLI plus overrides); the wiring
keys (data folder, ``init`` paths) are forced here, as ``rl pipeline`` does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from mm.train.common import barrier, is_main_process, on_rank0
from mm.train.metrics import atomic_write_text
from rl.agent.config import AgentRunConfig

SUBSTAGES = ("data", "pretrain", "align", "sft", "tune")
"""The note model's fixed sub-stages, in order; ``note_model.phases`` adds ``phase1``, ``phase2`` ..."""


def substages(cfg: AgentRunConfig) -> tuple[str, ...]:
    """Every sub-stage of ``cfg``'s note model, in the order they run."""
    return (*SUBSTAGES, *(f"phase{i}" for i in range(1, len(cfg.note_model.phases) + 1)))


def note_configs(cfg: AgentRunConfig, root: Path) -> dict[str, Any]:
    """The typed config of every training sub-stage, wired to ``root`` (errors before anything runs)."""
    from rl.pipeline import load_train_stage, resolve_training

    nm = cfg.note_model
    specs = {"pretrain": nm.pretrain, "align": nm.align, "sft": nm.sft, "tune": nm.tune}
    confs = resolve_training(specs, root / "data", root, prefix="note_model.")
    before = root / ("sft" if nm.tune is None else "tune") / "model"
    for i, spec in enumerate(nm.phases, 1):
        wiring = [f"data.folder={root / 'data'}", "init.pretrain=null", f"init.model={before}"]
        confs[f"phase{i}"] = load_train_stage(spec, wiring, f"note_model.phases[{i - 1}]")
        before = root / f"phase{i}" / "model"
    return confs


def model_folder(cfg: AgentRunConfig, root: Path) -> Path:
    """The folder of the note model the policy starts from: the last phase's, else ``tune``'s, else
    ``sft``'s."""
    nm = cfg.note_model
    last = f"phase{len(nm.phases)}" if nm.phases else "sft" if nm.tune is None else "tune"
    return root / last / "model"


def starting_from_it(cfg: AgentRunConfig, root: Path) -> AgentRunConfig:
    """``cfg`` for the stages after ``note_model``: ``policy.init`` is the built model (and the build off)."""
    policy = replace(cfg.policy, init=str(model_folder(cfg, root)))
    return replace(cfg, policy=policy, note_model=replace(cfg.note_model, build=False))


def run_note_model(
    cfg: AgentRunConfig, root: Path, *, log: Callable[[str], None] | None = None, show: bool = False
) -> dict[str, Any]:
    """Every sub-stage not done before; returns each one's result and the model folder. ``log`` (default:
    print, on rank 0 alone) takes a line per sub-stage."""
    log = log or (print if is_main_process() else lambda _: None)
    from rl.agent.world_export import export_world
    from rl.pipeline_stages import stage_pretrain, stage_train

    confs = note_configs(cfg, root)
    results: dict[str, Any] = {}
    # decided by every rank before rank 0 writes any done.json: a rank that looked later could see one this
    # run wrote, skip that sub-stage and leave rank 0 alone in its broadcast (a hang)
    finished = {name: (root / name / "done.json").exists() for name in substages(cfg)}
    barrier()
    for name in substages(cfg):
        out, done = root / name, root / name / "done.json"
        if finished[name]:
            results[name] = json.loads(done.read_text())
            log(f"[agent] note_model/{name}: done before, skipped")
            continue
        t0 = time.perf_counter()
        if name == "data":
            nm = cfg.note_model
            export = partial(export_world, cfg.world, nm.notes, out, workers=nm.workers, overwrite=True)
            res: dict[str, Any] = {"photo_notes": on_rank0(export)}
        elif name == "pretrain":
            res = stage_pretrain(confs[name], out, show, resume=True)
        elif name not in confs:
            res = {"skipped": "no note_model.tune"}
        else:
            res = stage_train(confs[name], out, show, resume=True)
        res["seconds"] = round(time.perf_counter() - t0, 1)
        results[name] = on_rank0(lambda out=out, done=done, res=res: _finished(out, done, res))
        log(f"[agent] note_model/{name}: done in {results[name]['seconds']} s")
    return {"model": str(model_folder(cfg, root)), **results}


def _finished(out: Path, done: Path, res: dict[str, Any]) -> dict[str, Any]:
    """``res`` written to the sub-stage's ``done.json``; the result."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(done, json.dumps(res, indent=1, default=str))
    return res
