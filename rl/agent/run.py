"""``rl agent`` end to end: stages with resume, each writing ``OUT/<stage>/result.json`` atomically.

    run_agent(cfg, Path("runs/agent"))

Stages, in order (a stage whose result.json exists is skipped on a re-run, so an interrupted run
continues where it stopped; GRPO also resumes from its last checkpoint inside the stage). A re-run must
keep the training sections of the config (``OUT/training_config.json``); ``eval`` may change: other eval
settings (more worlds, more tasks, other notes) evaluate every model again and rewrite the report, and
another ``eval.n_boot`` rewrites the report alone:

0. ``note_model``: with ``note_model.build``, a note model trained on the world's photos, which then is
   ``policy.init`` for every later stage (:mod:`rl.agent.note_model`) -> ``note_model/<sub-stage>/``
1. ``init``: the policy (``rl.agent.stages.build_backend``) -> ``init/model.pt``
2. ``perception``: single-turn reading of world images (``rl.agent.perception_stage``; a copy of
   ``init`` when ``perception.steps`` is 0) -> ``perception/model.pt``
3. ``sft_tool``: cold start on tool demonstrations, from ``perception`` -> ``sft_tool/model.pt``
4. ``sft_notool``: the no-tool baseline, same size, start and SFT budget -> ``sft_notool/model.pt``
5. ``grpo``: multi-turn GRPO from ``sft_tool`` -> ``grpo/model.pt``
6. ``ppo``: with ``ppo.steps > 0``, multi-turn PPO with a critic from ``sft_tool`` (:mod:`rl.agent.ppo`)
   -> ``ppo/model.pt``, ``ppo/value_head.pt``
7. ``export``: the trained tool policies as complete model folders (weights, config, processor), which
   ``policy.init``, ``mm.model.adapter.load_adapter`` and, for a transformers family,
   ``AutoModelForImageTextToText.from_pretrained`` load -> ``export/tool_grpo/`` (and ``export/tool_ppo/``)
8. ``eval``: the models (three, four with PPO) on the held-out tasks -> ``eval/<model>.jsonl`` rows
9. ``report``: ``report.md``, ``report.json``, ``transcripts.md``, ``*.png`` curves

The ``ppo`` section may change on a re-run until its stage has trained, so PPO can be added to a finished
run: the PPO stage runs, then the eval of the missing model and the report. Likewise the ``grpo`` section
until GRPO or PPO (which takes GRPO's reward) has trained: a copy of a run's folder up to ``sft_notool``
re-tunes post-training on the same SFT models.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mm.config import to_dict
from mm.errors import UserError
from mm.train.devices import launched_processes, resolve_device
from mm.train.metrics import atomic_write_text
from rl.agent.config import AgentRunConfig
from rl.agent.evaluate import eval_model, eval_sets, eval_size
from rl.agent.note_model import run_note_model, starting_from_it
from rl.agent.parallel import barrier, check_parallel, is_writer, join
from rl.agent.perception_stage import run_perception
from rl.agent.ppo import run_ppo
from rl.agent.quote import check_quote
from rl.agent.report import write_report
from rl.agent.stages import build_backend, run_grpo, run_sft, save_weights, train_tasks
from rl.agent.task_file import file_digest
from rl.agent.tools import TOOLS, check_tool_options, configure_tool_modules, import_tool_modules

STAGES = (
    "note_model",
    "init",
    "perception",
    "sft_tool",
    "sft_notool",
    "grpo",
    "ppo",
    "export",
    "eval",
    "report",
)
"""The stages of ``rl agent``, in order."""
MODELS = {"notool_sft": ("sft_notool", False), "tool_sft": ("sft_tool", True), "tool_grpo": ("grpo", True)}
"""Evaluated model -> (the stage whose model.pt it is, whether it has tools); :func:`models_of` adds PPO's."""


TRAINING_SECTIONS = (
    "policy", "note_model", "world", "data", "rollout", "perception", "sft", "grpo", "ppo", "decode", "seed",
    "tool_modules", "tool_options", "lora",
)  # fmt: skip
"""Config sections a resumed run must keep (the trained models depend on them)."""
LATE_SECTIONS = {"ppo": ("ppo",), "grpo": ("grpo", "ppo"), "decode": ("grpo", "ppo")}
"""Section -> the stages that read it (PPO takes GRPO's reward and sampling): the section may change until
one of them has trained, so post-training can be re-tuned on the run's SFT models."""


def check_inputs(cfg: AgentRunConfig) -> None:
    """What can be checked before anything is written: what a multi-process launch can run, the tool
    modules import and register their tools, the policy's device is there, and every line of the task
    files reads (its images, its demonstration's calls)."""
    check_parallel(cfg, launched_processes())
    import_tool_modules(cfg.tool_modules)
    check_tool_options(cfg.tool_options)
    check_quote(cfg.decode.quote, TOOLS)
    resolve_device(cfg.policy.device, key="policy.device")
    if cfg.data.file is not None:
        train_tasks(cfg)
    if cfg.eval.file is not None:
        eval_sets(cfg)


def models_of(cfg: AgentRunConfig) -> dict[str, tuple[str, bool]]:
    """The evaluated models of a run: :data:`MODELS`, and ``tool_ppo`` when ``ppo.steps > 0``."""
    return MODELS | ({"tool_ppo": ("ppo", True)} if cfg.ppo.steps > 0 else {})


def check_training_config(cfg: AgentRunConfig, out: Path) -> None:
    """Record the training sections in ``OUT/training_config.json``, or refuse a resume that changed them
    (a :data:`LATE_SECTIONS` section none of whose stages has trained is taken as it is now)."""
    mine = {k: v for k, v in to_dict(cfg).items() if k in TRAINING_SECTIONS}
    if cfg.data.file is not None:  # the tasks trained on: another file at the same path is another run
        mine["data"] = {**mine["data"], "file_sha256": file_digest(cfg.data.file)}
    path = out / "training_config.json"
    if not path.exists():
        if is_writer():
            atomic_write_text(path, json.dumps(mine, indent=1))
        return
    # a section or key added to the config after the run started was at its default in that run
    default = json.loads(json.dumps(to_dict(AgentRunConfig())))
    before = _filled(json.loads(path.read_text()), {k: default[k] for k in TRAINING_SECTIONS})
    now = json.loads(json.dumps(mine))
    changed = sorted(k for k in TRAINING_SECTIONS if _used(k, before[k]) != _used(k, now[k]))
    late = [
        k for k in changed
        if k in LATE_SECTIONS and not any((out / s / "metrics.jsonl").exists() for s in LATE_SECTIONS[k])
    ]  # fmt: skip
    if late and len(late) == len(changed):
        for section in late:  # its stages never trained: forget "not run" markers, record the new settings
            for stage in LATE_SECTIONS[section]:
                result_path(out, stage).unlink(missing_ok=True)
        atomic_write_text(path, json.dumps(before | {k: now[k] for k in late}, indent=1))
        return
    changed = [k for k in changed if k not in late]
    if changed:
        raise UserError(
            f"{out} was trained with other {', '.join(changed)} settings than this config; resuming would "
            "mix them. Use a new --out, or --no-resume to start over"
        )


def _filled(recorded: Any, default: Any) -> Any:
    """``recorded`` with every dict key it lacks taken from ``default``, recursively."""
    if not isinstance(recorded, dict) or not isinstance(default, dict):
        return recorded
    return {k: _filled(recorded[k], v) if k in recorded else v for k, v in default.items()} | {
        k: v for k, v in recorded.items() if k not in default
    }


def _used(section: str, value: Any) -> Any:
    """The part of a recorded section the stages read: a note-model recipe that is not built is not, and
    where decoded images are kept (``data.image_cache``) or the policy runs (``policy.device``) are not what
    it learns."""
    if section == "note_model" and isinstance(value, dict) and not value.get("build"):
        return {"build": False}
    ignored = {"data": "image_cache", "policy": "device"}.get(section)
    if ignored and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != ignored}
    return value


def result_path(out: Path, stage: str) -> Path:
    return out / stage / "result.json"


def write_result(out: Path, stage: str, result: dict[str, Any]) -> None:
    """``OUT/<stage>/result.json``, atomically (its presence marks the stage done)."""
    path = result_path(out, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, indent=1, default=str))


def run_agent(
    cfg: AgentRunConfig,
    out: Path,
    *,
    log: Callable[[str], None] = print,
    grpo_stop_after: int | None = None,
    ppo_stop_after: int | None = None,
) -> dict[str, Any] | None:
    """Run (or resume) every stage; returns the report's JSON, or None when ``grpo_stop_after`` (or
    ``ppo_stop_after``) stopped the GRPO (PPO) stage early (a simulated interruption, for tests)."""
    check_inputs(cfg)
    join(resolve_device(cfg.policy.device, key="policy.device"))  # a torchrun launch: data parallel
    if not is_writer():
        log = _silent
    out.mkdir(parents=True, exist_ok=True)
    check_training_config(cfg, out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    for stage in STAGES:
        if stage == "init":
            if cfg.note_model.build:  # every stage from here starts from the note model
                cfg = starting_from_it(cfg, out / "note_model")
            configure_tool_modules(cfg.tool_modules, cfg)  # a tool that needs the starting model
        barrier()  # every rank decides from what rank 0 wrote
        if _done(out, stage, cfg):
            log(f"[agent] {stage}: done before, skipped")
            continue
        t0 = time.perf_counter()
        stage_dir = out / stage
        stage_dir.mkdir(parents=True, exist_ok=True)
        result = _run_stage(cfg, out, stage, stage_dir, grpo_stop_after, ppo_stop_after=ppo_stop_after)
        if result is None:
            log(f"[agent] {stage}: stopped before the end (re-run to resume)")
            return None
        result["seconds"] = round(time.perf_counter() - t0, 1)
        if is_writer():
            write_result(out, stage, result)
        log(f"[agent] {stage}: done in {result['seconds']} s")
    barrier()
    return json.loads((out / "report.json").read_text())


def _silent(_: str) -> None:
    """The log of ranks other than 0."""


def _done(out: Path, stage: str, cfg: AgentRunConfig) -> bool:
    """Whether ``stage`` finished before; eval and report only for the same models (adding PPO to a
    finished run evaluates the new model and rewrites the report) and the same eval settings (other
    ``eval`` settings evaluate every model again). Deleting a model's ``eval/<model>.jsonl`` evaluates that
    model again, and a report written from another eval than the last is written again."""
    path = result_path(out, stage)
    if not path.exists():
        return False
    if stage == "export":  # PPO added to a finished run: its policy is exported too
        return json.loads(path.read_text()).get("models") == exported(cfg)
    if stage not in ("eval", "report"):
        return True
    models = models_of(cfg)
    result = json.loads(path.read_text())
    if stage == "eval":
        if not all((out / "eval" / f"{m}.jsonl").exists() for m in models):
            return False  # rows deleted to be redone
        if not _rows_match(out, cfg):
            return False  # other eval settings
    if stage == "report":
        if not _from_last_eval(out, result):
            return False  # the eval ran again since
        if result.get("n_boot", cfg.eval.n_boot) != cfg.eval.n_boot:
            return False
    done = result["rows"] if stage == "eval" else result.get("models", list(MODELS))
    return sorted(done) == sorted(models)


def row_settings(cfg: AgentRunConfig) -> dict[str, Any]:
    """The eval settings a model's rows (and transcripts) depend on: all but ``n_boot`` (the report's), and
    the contents of ``eval.file`` (another file at the same path is other tasks), and ``decode`` when it
    constrains anything."""
    settings = {k: v for k, v in to_dict(cfg.eval).items() if k != "n_boot"}
    decode = {k: v for k, v in to_dict(cfg.decode).items() if v}  # what constrains the tool models' turns
    if decode:  # absent when free, and each setting only when set: rows from before it stay valid
        settings["decode"] = decode
    if cfg.eval.file is not None:
        settings["file_sha256"] = file_digest(cfg.eval.file)
    return settings


def _rows_match(out: Path, cfg: AgentRunConfig) -> bool:
    """Whether the eval rows there were made with ``cfg``'s eval settings: ``eval/settings.json``; a run
    from before that record is judged by its finished eval's seeds and row counts (a changed ``start`` or
    ``split`` goes unseen there: delete ``eval/`` to redo it)."""
    path = out / "eval" / "settings.json"
    if path.exists():
        return json.loads(path.read_text()) == json.loads(json.dumps(row_settings(cfg)))
    if not result_path(out, "eval").exists():
        return True
    result = json.loads(result_path(out, "eval").read_text())
    per_model = len(cfg.eval.seeds) * cfg.eval.tasks_per_kind * len(cfg.data.kinds)
    counts_ok = all(n == per_model for n in result["rows"].values())
    return result.get("seeds") == list(cfg.eval.seeds) and counts_ok


def _from_last_eval(out: Path, report: dict[str, Any]) -> bool:
    """Whether the report was written from the eval there now: its recorded stamp, or for a report from
    before the stamp, written after the eval's result."""
    if "eval" in report:
        return report["eval"] == _eval_stamp(out)
    evaluated = result_path(out, "eval")
    return not evaluated.exists() or result_path(out, "report").stat().st_mtime >= evaluated.stat().st_mtime


def _eval_stamp(out: Path) -> str:
    """Which eval a report is written from: a digest of ``eval/result.json`` (with its fresh id per eval)."""
    path = result_path(out, "eval")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else ""


def _run_stage(
    cfg: AgentRunConfig,
    out: Path,
    stage: str,
    stage_dir: Path,
    grpo_stop_after: int | None = None,
    ppo_stop_after: int | None = None,
) -> dict[str, Any] | None:
    init = out / "perception" / "model.pt"
    if stage == "note_model":
        if not cfg.note_model.build:
            return {"build": False}
        return run_note_model(cfg, stage_dir)
    if not is_writer() and stage in WRITER_ONLY:
        return {}
    if stage == "init":
        backend = build_backend(cfg)
        save_weights(backend, stage_dir / "model.pt")
        model = backend.adapter.model
        return {"family": backend.adapter.family, "parameters": sum(p.numel() for p in model.parameters())}
    if stage == "perception":
        if cfg.perception.steps == 0 and not cfg.perception.check_notes:
            if is_writer():
                shutil.copyfile(out / "init" / "model.pt", stage_dir / "model.pt")
            return {"stage": "perception", "steps": 0}
        return run_perception(cfg, stage_dir, out / "init" / "model.pt")
    if stage == "sft_tool":
        return run_sft(cfg, stage_dir, init, tools=True, stage=stage)
    if stage == "sft_notool":
        return run_sft(cfg, stage_dir, init, tools=False, stage=stage)
    if stage == "grpo":
        if cfg.grpo.steps == 0:
            shutil.copyfile(out / "sft_tool" / "model.pt", stage_dir / "model.pt")
            return {"stage": "grpo", "steps": 0}
        return run_grpo(cfg, stage_dir, out / "sft_tool" / "model.pt", stop_after=grpo_stop_after)
    if stage == "ppo":
        if cfg.ppo.steps == 0:
            return {"stage": "ppo", "steps": 0}
        return run_ppo(cfg, stage_dir, out / "sft_tool" / "model.pt", stop_after=ppo_stop_after)
    if stage == "export":
        return _export(cfg, out, stage_dir)
    if stage == "eval":
        return _eval(cfg, out, stage_dir)
    if stage == "report":
        return {**write_report(cfg, out, models_of(cfg)), "eval": _eval_stamp(out), "n_boot": cfg.eval.n_boot}
    raise ValueError(f"unknown stage {stage!r}; stages: {STAGES}")


WRITER_ONLY = ("init", "export", "report")
"""Stages rank 0 runs alone under data parallel (they train nothing); the others wait at the next stage's
barrier. The training stages, the note model's included (:mod:`rl.agent.note_model`), and the eval share
the work."""


def exported(cfg: AgentRunConfig) -> list[str]:
    """The models the ``export`` stage writes: the tool GRPO policy, and the tool PPO one when trained."""
    return [m for m in ("tool_grpo", "tool_ppo") if m in models_of(cfg)]


def _export(cfg: AgentRunConfig, out: Path, stage_dir: Path) -> dict[str, Any]:
    """Each :func:`exported` model as a complete folder in ``export/<model>/``, written to a temporary
    folder first and moved into place, so a folder there is whole."""
    for name in exported(cfg):
        stage, _ = models_of(cfg)[name]
        backend = build_backend(cfg, out / stage / "model.pt")
        tmp, final = stage_dir / f".{name}.tmp", stage_dir / name
        shutil.rmtree(tmp, ignore_errors=True)
        backend.adapter.merge_and_save(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    return {"models": exported(cfg), "folders": [str(stage_dir / m) for m in exported(cfg)]}


def _eval(cfg: AgentRunConfig, out: Path, stage_dir: Path) -> dict[str, Any]:
    """Held-out rows of every model; a model whose rows are there from before, made with the same eval
    settings (``eval/settings.json``) and as many as those settings make, is not evaluated again (rows
    of another count were cut short, or copied from another eval)."""
    expected = eval_size(cfg)
    done = {  # decided by every rank before rank 0 deletes or writes anything
        name: _rows_match(out, cfg) and (stage_dir / f"{name}.jsonl").exists()
        and len((stage_dir / f"{name}.jsonl").read_text().splitlines()) == expected
        for name in models_of(cfg)
    }  # fmt: skip
    barrier()
    if is_writer():
        if not _rows_match(out, cfg):
            for path in [*stage_dir.glob("*.jsonl"), *stage_dir.glob("*.transcripts.md")]:
                path.unlink()  # rows of other eval settings: every model is evaluated again
        atomic_write_text(stage_dir / "settings.json", json.dumps(row_settings(cfg), indent=1))
    counts = {}
    for name, (stage, tools) in models_of(cfg).items():
        if done[name]:
            counts[name] = expected
            continue
        backend = build_backend(cfg, out / stage / "model.pt")
        rows, shown = eval_model(backend, cfg, tools=tools, transcripts=cfg.eval.transcripts)
        if is_writer():
            atomic_write_text(stage_dir / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
            atomic_write_text(stage_dir / f"{name}.transcripts.md", "\n\n".join(shown))
        counts[name] = len(rows)
    # a fresh id per eval: two evals with equal rows and equal rounded seconds would otherwise write equal
    # result.json files, and a report written from the first would pass for one written from the second
    return {"rows": counts, "seeds": list(cfg.eval.seeds), "id": uuid.uuid4().hex}
