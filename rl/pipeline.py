"""``rl pipeline``: the main job on the built-in note world, one stage after another (data parallel under
``torchrun``: below).

    rl pipeline --config configs/rl/pipeline.yaml --out runs/demo [--fresh | --redo dpo ...] [--seeds N]
    rl pipeline --config configs/rl/pipeline.yaml --out runs/table --world-seeds 0 1 2 --seeds 2

Stages (each writes its own subfolder of OUT; every call is an in-process library function)::

    data      mm.world.generate.write_world           OUT/data/world (notes.jsonl + images)
    pretrain  mm.train.pretrain.train (InfoNCE)       OUT/pretrain  (metrics.jsonl, curves.png, checkpoints)
    align     mm.train.sft.train (stage align)         OUT/align     (... + model/)
    sft       mm.train.sft.train (stage sft)           OUT/sft
    eval_sft  mm.eval.runners.evaluate_model           OUT/eval_sft/eval.json (CHAIR, POPE x3, causes)
    dpo       rl.trainers.dpo.train (from SFT)         OUT/dpo
    eval_dpo                                           OUT/eval_dpo/eval.json
    grpo      rl.trainers.grpo.train (from SFT)        OUT/grpo
    eval_grpo                                          OUT/eval_grpo/eval.json

then ``OUT/report.md``, ``OUT/metrics.json`` and the report plots (:mod:`rl.report`). With
``--world-seeds`` the whole pipeline runs per world seed and one table sums up every run
(:mod:`rl.pipeline_table`); ``ground_truth: false`` is the no-ground-truth pipeline (:mod:`rl.pipeline_nogt`).

The pipeline config (:class:`PipelineConfig`) points at each stage's own YAML (the same files the
stage CLIs take; optional overrides on top); the pipeline then forces the wiring keys (data folder,
``init`` paths) so the stages chain. A stage that finished writes ``OUT/<stage>/stage.json`` (its
resolved config, metrics, wall time, peak RSS); a later run skips it when the resolved config is
unchanged (resume), refuses when it changed, and ``--fresh`` (all) or ``--redo STAGE`` (that one and
every stage after it) runs them again. Paths inside the run folder are compared resolved, so the same
``--out`` spelt differently (relative or absolute, ``./runs/x``, ``runs/x/``) resumes. A stage
interrupted mid-way resumes from its own checkpoints.

Under ``torchrun`` / ``accelerate launch`` every stage is data parallel: the training stages take each
step's batch in shares (their trainers' own data parallelism), the eval stages generate a strided share
of the items each (:mod:`mm.eval.parallel`); rank 0 alone renders the world and writes the stage markers,
the eval files and the report (:func:`mm.train.common.on_rank0`), and every rank starts a stage only
after the one before has finished on all of them.

The pipeline lives on the ``rl`` side because ``rl`` may import ``mm`` but not the reverse.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm.errors import UserError
from mm.model.pretrained_lm import text_hidden_size
from rl.pipeline_nogt import check_without_ground_truth, self_feedback_wiring
from rl.pipeline_seeds import run_seeds
from rl.pipeline_stages import (
    POST_STAGES,
    _atomic_json,
    _config_dict,
    _rss_mb,
    _stage_data,
    _stage_eval,
    _stage_post,
    stage_folder,
    stage_pretrain,
    stage_train,
)

POPE_SPLITS = ("random", "popular", "adversarial")


@dataclass(kw_only=True)
class StageSpec:
    """One stage: its own YAML config (the file its CLI takes) and overrides applied on top."""

    config: str
    """Path of the stage's YAML config (relative to the working directory)."""
    overrides: list[str] = field(default_factory=list)
    """``dotted.key=value`` overrides, applied after the file (the pipeline's wiring keys win): for quick
    experiments (``--set 'dpo.overrides=[train.steps=5]'``); a recipe belongs in the stage's YAML."""


@dataclass(kw_only=True)
class WorldSpec:
    """The synthetic note world the pipeline generates."""

    config: str = "configs/mm/world.yaml"
    """WorldConfig YAML (mm.world.config.WorldConfig)."""
    overrides: list[str] = field(default_factory=list)
    """``key=value`` overrides of the WorldConfig (e.g. ``notes=4000``)."""
    workers: int = 2
    """Processes that render the notes."""


@dataclass(kw_only=True)
class EvalSpec:
    """Held-out evaluation of the SFT and post-trained models (mm.eval.runners.evaluate_model)."""

    split: str = "test"
    """Held-out note split."""
    notes: int = 200
    """First n held-out notes with objects (captions for CHAIR; POPE questions from their images)."""
    pope_splits: list[str] = field(default_factory=lambda: list(POPE_SPLITS))
    """POPE negative-sampling settings: random, popular, adversarial."""
    batch_size: int = 64
    """Generation batch size."""
    max_new_tokens: int = 96
    """Longest generated caption."""
    seed: int = 0
    """Seed of the POPE question builder."""

    def __post_init__(self) -> None:
        bad = [s for s in self.pope_splits if s not in POPE_SPLITS]
        if bad or "adversarial" not in self.pope_splits:
            raise ValueError(
                f"eval.pope_splits must be a subset of {POPE_SPLITS} that includes adversarial (the report "
                f"compares it), got {self.pope_splits}"
            )
        if self.notes < 1 or self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"eval.notes, batch_size and max_new_tokens must be >= 1, got {self.notes}, "
                f"{self.batch_size}, {self.max_new_tokens}"
            )


@dataclass(kw_only=True)
class PipelineConfig:
    """Everything ``rl pipeline`` needs: the world, a config per stage, evaluation, post-training."""

    world: WorldSpec = field(default_factory=WorldSpec)
    """The note world (generated into OUT/data/world)."""
    pretrain: StageSpec = field(default_factory=lambda: StageSpec(config="configs/mm/pretrain.yaml"))
    """InfoNCE pretraining (mm.train.pretrain.PretrainConfig)."""
    align: StageSpec = field(default_factory=lambda: StageSpec(config="configs/mm/align.yaml"))
    """Align stage (mm.train.sft.TrainConfig with train.stage align); starts from the pretraining."""
    sft: StageSpec = field(default_factory=lambda: StageSpec(config="configs/mm/sft.yaml"))
    """SFT stage (mm.train.sft.TrainConfig with train.stage sft); starts from the align model."""
    eval: EvalSpec = field(default_factory=EvalSpec)
    """Held-out evaluation after SFT and after each post-training stage."""
    post: list[str] = field(default_factory=lambda: ["dpo", "grpo"])
    """Post-training stages to run, each from the SFT model: dpo, grpo (empty = stop after SFT)."""
    dpo: StageSpec = field(default_factory=lambda: StageSpec(config="configs/rl/dpo.yaml"))
    """DPO (rl.trainers.dpo.DPOConfig)."""
    grpo: StageSpec = field(default_factory=lambda: StageSpec(config="configs/rl/grpo.yaml"))
    """GRPO (rl.trainers.grpo.GRPOConfig)."""
    ground_truth: bool = True
    """Whether post-training may read the notes' ground truth (the scene reward). false: the pipeline
    without ground truth (configs/rl/pipeline_nogt.yaml): every post-training stage must take its reward
    from a labeler or a reward model (checked before anything runs, :mod:`rl.pipeline_nogt`), and its
    trainer gets the notes stripped of ground truth (:mod:`rl.ground_truth`); only the eval stages read
    it."""
    threads: int = 0
    """torch.set_num_threads for the whole pipeline; 0 leaves the default."""

    def __post_init__(self) -> None:
        bad = [s for s in self.post if s not in POST_STAGES]
        if bad or len(set(self.post)) != len(self.post):
            raise ValueError(f"post must list distinct stages from {sorted(POST_STAGES)}, got {self.post}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")


def stage_names(cfg: PipelineConfig) -> list[str]:
    """The stages this config runs, in order."""
    names = ["data", "pretrain", "align", "sft", "eval_sft"]
    for p in cfg.post:
        names += [p, f"eval_{p}"]
    return names


# ---------------------------------------------------------------- resolving the stage configs


def load_stage_config(cls: type, spec: StageSpec | WorldSpec, wiring: list[str], what: str) -> Any:
    """``cls`` loaded from ``spec``'s YAML, its overrides, then ``wiring`` (which wins); ``what`` names the
    stage in errors (a missing file, a bad key)."""
    from mm.config import ConfigError, load_config

    if not Path(spec.config).is_file():
        raise UserError(
            f"{what}.config={spec.config!r} does not exist (paths are relative to {Path.cwd()}); "
            "point it at a YAML file, e.g. one under configs/"
        )
    try:
        return load_config(cls, spec.config, [*spec.overrides, *wiring])
    except ConfigError as e:
        raise ConfigError(f"{what} ({spec.config}): {e}") from None


def load_train_stage(spec: StageSpec, wiring: list[str], name: str, want: str = "sft") -> Any:
    """The typed config (mm.train.sft.TrainConfig) of the ``mm train`` stage ``spec`` with the ``wiring``
    overrides applied last; its ``train.stage`` must be ``want``. ``name`` names it in errors."""
    from mm.train.sft import TrainConfig

    conf = load_stage_config(TrainConfig, spec, wiring, name)
    if conf.train.stage != want:
        raise UserError(
            f"{name}.config {spec.config} has train.stage={conf.train.stage!r}; the {name.split('.')[-1]} "
            f"stage needs a train.stage {want} config"
        )
    return conf


def resolve_training(
    specs: dict[str, StageSpec | None], data_dir: Path, out: Path, prefix: str = ""
) -> dict[str, Any]:
    """The typed configs of the note model's training chain, pretrain -> align -> sft (-> tune, when its spec
    is given), each stage wired to read ``data_dir`` and start from the one before in ``out/<stage>``;
    ``prefix`` names the specs in errors (``note_model.``). Errors before anything runs."""
    from mm.train.pretrain import PretrainConfig

    data = f"data.folder={data_dir}"
    res: dict[str, Any] = {
        "pretrain": load_stage_config(PretrainConfig, specs["pretrain"], [data], f"{prefix}pretrain")
    }
    starts = {
        "align": [f"init.pretrain={out / 'pretrain'}", "init.model=null"],
        "sft": ["init.pretrain=null", f"init.model={out / 'align' / 'model'}"],
        "tune": ["init.pretrain=null", f"init.model={out / 'sft' / 'model'}"],
    }
    for name, init in starts.items():
        spec = specs.get(name)
        if spec is not None:
            want = "align" if name == "align" else "sft"
            res[name] = load_train_stage(spec, [data, *init], f"{prefix}{name}", want)
    d, h = res["pretrain"].model.d_model, text_hidden_size(res["align"].model.text)
    if d != h:
        raise UserError(
            f"{prefix}align model.text.hidden_size={h} must equal {prefix}pretrain model.d_model={d} (align "
            "starts from the pretrained fusion); change one of the two configs"
        )
    return res


def resolve(cfg: PipelineConfig, out: Path) -> dict[str, Any]:
    """Every stage's typed config with the pipeline's wiring applied; errors before anything runs."""
    import importlib

    from mm.world.config import WorldConfig

    world_dir = out / "data" / "world"
    data = f"data.folder={world_dir}"
    res: dict[str, Any] = {"data": load_stage_config(WorldConfig, cfg.world, [], "world")}
    specs = {"pretrain": cfg.pretrain, "align": cfg.align, "sft": cfg.sft}
    res.update(resolve_training(specs, world_dir, out))
    sft_model = str(out / "sft" / "model")
    for name in cfg.post:
        module, cls_name = POST_STAGES[name]
        cls = getattr(importlib.import_module(module), cls_name)
        spec = getattr(cfg, name)
        extra = self_feedback_wiring(name, load_stage_config(cls, spec, [], name), sft_model)
        if not cfg.ground_truth:  # the trainers get the notes stripped of their ground truth
            extra.append("data.ground_truth=false")
        res[name] = load_stage_config(cls, spec, [data, f"init.model={sft_model}", *extra], name)
    if not cfg.ground_truth:
        check_without_ground_truth(res, list(cfg.post))
    return res


def _defaults(c: Any) -> Any:
    """The config dict of ``type(c)()`` (every option at its default), or {} when it needs arguments."""
    try:
        return _config_dict(type(c)())
    except Exception:  # noqa: BLE001 - a config class without defaults: compare strictly
        return {}


def in_run_folder(conf: Any, out: Path) -> Any:
    """``conf`` with every string that names a path inside the run folder ``out`` rewritten as
    ``$OUT/<path relative to out>``: the same folder spelt differently (relative or absolute, ``./runs/x``,
    ``runs/x/``, through a symlink) then compares equal. Relative strings resolve against the working
    directory, as the stages read them."""
    root = Path(out).resolve()

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str) and v:
            try:
                rel = Path(v).resolve().relative_to(root)
            except (ValueError, OSError):  # not inside the run folder, or not a path at all
                return v
            return "$OUT" if rel == Path() else f"$OUT/{rel.as_posix()}"
        return v

    return walk(conf)


def same_config(old: Any, new: Any, default: Any = None) -> bool:
    """Whether a finished stage's recorded config ``old`` matches the resolved ``new``. A key that ``old``
    lacks counts as unchanged when ``new`` holds its default (``default``: the defaults' dict): an option
    added to notelens after the stage ran, left at its default, does not invalidate the stage."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return old == new
    d = default if isinstance(default, dict) else {}
    if any(k not in new for k in old):
        return False
    for k, v in new.items():
        if k not in old:
            if k not in d or v != d[k]:
                return False
        elif not same_config(old[k], v, d.get(k)):
            return False
    return True


# ---------------------------------------------------------------- the run


def run_pipeline(
    cfg: PipelineConfig,
    out: str | Path,
    *,
    fresh: bool = False,
    redo: list[str] | None = None,
    show_progress: bool = True,
    log: Any = None,
    seeds: int = 1,
) -> dict[str, Any]:
    """Run (or resume) every stage into ``out``, then write the report; returns the metrics dict.

    ``fresh`` redoes every stage; ``redo`` names stages to redo together with every stage after them;
    ``seeds`` > 1 re-runs post-training with that many training seeds (:mod:`rl.pipeline_seeds`).
    ``log(text)`` receives one line per stage (default: stderr).
    """
    import torch

    from mm.train.common import is_main_process, join_launch, on_rank0
    from rl import report

    join_launch()
    log = log or (lambda s: print(s, file=sys.stderr, flush=True) if is_main_process() else None)
    out = Path(out)
    names = stage_names(cfg)
    bad = [r for r in redo or [] if r not in names]
    if bad:
        raise UserError(f"--redo {bad}: not a stage of this pipeline; stages are {names}")
    if seeds < 1:
        raise UserError(f"--seeds {seeds}: pass 1 (the main run only) or more training seeds")
    configs = resolve(cfg, out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    first_redo = min((names.index(r) for r in redo or []), default=len(names))
    on_rank0(lambda: out.mkdir(parents=True, exist_ok=True))
    t_all = time.perf_counter()
    stages: dict[str, dict[str, Any]] = {}
    rerun_rest = False
    for i, name in enumerate(names):
        folder = out / name
        marker = folder / "stage.json"
        base = name.removeprefix("eval_")
        stage_cfg = configs[base] if name == base else cfg.eval
        conf = _config_dict(stage_cfg)
        force = fresh or rerun_rest or i >= first_redo
        if marker.is_file() and not force:
            done = json.loads(marker.read_text())
            old = in_run_folder(done.get("config"), Path(done.get("out", out)))  # "out": where it ran
            if not same_config(old, in_run_folder(conf, out), _defaults(stage_cfg)):
                raise UserError(
                    f"stage {name} in {out} was made with a different config; pass --redo {name} (redoes it "
                    "and the stages after it), --fresh, or choose a new --out"
                )
            stages[name] = {**done, "status": "skipped (done earlier)"}
            log(f"[{i + 1}/{len(names)}] {name}: done earlier ({done['seconds']:.1f}s), skipped")
            continue
        rerun_rest = True  # a stage that runs again invalidates the stages after it
        on_rank0(lambda folder=folder, force=force: stage_folder(folder, force))
        log(f"[{i + 1}/{len(names)}] {name} ...")
        t0 = time.perf_counter()
        c = configs.get(base)
        if name == "data":
            metrics = on_rank0(lambda c=c, folder=folder: _stage_data(c, folder, show_progress, cfg.world))
        elif name == "pretrain":
            metrics = stage_pretrain(c, folder, show_progress, resume=True)
        elif name in ("align", "sft"):
            metrics = stage_train(c, folder, show_progress, resume=True)
        elif name in POST_STAGES:
            metrics = _stage_post(name, c, folder, show_progress, resume=True)
        else:
            metrics = _stage_eval(out / base / "model", out / "data" / "world", cfg.eval, folder)
        record = {
            "stage": name,
            "status": "ran",
            "seconds": round(time.perf_counter() - t0, 2),
            **_rss_mb(),
            "out": str(out.resolve()),
            "config": conf,
            "metrics": metrics,
        }
        record = on_rank0(lambda marker=marker, record=record: _recorded(marker, record))
        stages[name] = record
        log(
            f"[{i + 1}/{len(names)}] {name}: {record['seconds']:.1f}s, "
            f"peak RSS {record['peak_rss_mb']:.0f} MiB"
        )
    seed_runs = None
    if seeds > 1 and cfg.post:
        seed_runs = run_seeds(
            cfg, configs, stages, out, seeds, fresh=fresh, show_progress=show_progress, log=log
        )
    metrics = report.build_metrics(
        stages, post=list(cfg.post), wall_seconds=time.perf_counter() - t_all, rss=_rss_mb(),
        load=_load_avg(), seed_runs=seed_runs,
    )  # fmt: skip
    on_rank0(lambda: report.write_report(out, metrics))
    log(f"report: {out / 'report.md'}")
    return metrics


def _recorded(marker: Path, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` written to the stage marker ``marker``; the record."""
    _atomic_json(marker, record)
    return record


def _load_avg() -> list[float] | None:
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="configs/rl/pipeline.yaml", help="PipelineConfig YAML")
    parser.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override pipeline keys, e.g. --set eval.notes=100 'dpo.overrides=[train.steps=5]' (repeatable)",
    )  # fmt: skip
    parser.add_argument("--fresh", action="store_true", help="redo every stage (ignore finished stages)")
    parser.add_argument(
        "--redo", nargs="+", default=[], metavar="STAGE", help="redo these stages and every stage after them"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the per-stage progress bars")
    parser.add_argument(
        "--seeds", type=int, default=1, metavar="N",
        help="re-run post-training with N training seeds from the same SFT model; mean +- sd (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--world-seeds", type=int, nargs="+", default=None, metavar="W",
        help="run the pipeline per world seed into OUT/world<W>, then write OUT/table.md and table.json: "
        "every run, the mean +- sd and t interval of each change over world x training seeds",
    )  # fmt: skip
    parser.add_argument(
        "--against", default=None, metavar="DIR",
        help="with --world-seeds: add the difference of the means from the table in DIR (its table.json)",
    )  # fmt: skip
    parser.add_argument(
        "--table-only", action="store_true", help="with --world-seeds: tabulate the runs in OUT, run nothing"
    )


def run(args: argparse.Namespace) -> int:
    from mm.config import load_config
    from mm.train.common import is_main_process, join_launch

    cfg = load_config(PipelineConfig, args.config, args.overrides)
    join_launch()  # under torchrun: every command below shares its work, rank 0 writes
    if args.world_seeds is not None:
        from rl.pipeline_table import run_table

        table = run_table(
            cfg, args.out, args.world_seeds, seeds=args.seeds, table_only=args.table_only, run=run_pipeline,
            other=args.against, fresh=args.fresh, redo=args.redo, show_progress=not args.no_progress,
        )  # fmt: skip
        if is_main_process():
            keys = ("targets_met", "targets_total")
            print(
                json.dumps({p: {"runs": len(t["runs"]), **{k: t[k] for k in keys}} for p, t in table.items()})
            )
        return 0
    if args.table_only or args.against:
        raise UserError("--table-only and --against need --world-seeds (the world seeds to tabulate)")
    metrics = run_pipeline(
        cfg, args.out, fresh=args.fresh, redo=args.redo, show_progress=not args.no_progress, seeds=args.seeds
    )
    if is_main_process():
        print(json.dumps(metrics["headline"], default=str))
    return 0
