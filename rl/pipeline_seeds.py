"""``rl pipeline --seeds N``: post-training re-run with N training seeds, all from the same SFT model.

Run k of N (k = 0 .. N-1) trains each post-training stage with ``train.seed = s0 + k`` (``s0``: the
stage config's own seed). Run 0 is the pipeline's main run (``OUT/<post>``, ``OUT/eval_<post>``); the
others go to ``OUT/seeds/<seed>/<post>`` and ``OUT/seeds/<seed>/eval_<post>``, each with its
``stage.json``, so a later call with the same config skips what is done (``--fresh`` redoes them). The
report lists every run and the mean +- sd of each change against SFT (:mod:`rl.report_uncertainty`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from mm.train.common import on_rank0
from rl.pipeline_stages import _atomic_json, _config_dict, _rss_mb, _stage_eval, _stage_post, stage_folder
from rl.report_uncertainty import SEED_KEYS


def _with_seed(c: Any, seed: int) -> Any:
    return dataclasses.replace(c, train=dataclasses.replace(c.train, seed=seed))


def _run_once(name: str, folder: Path, conf: Any, fresh: bool, work: Any, log: Any) -> dict[str, Any]:
    """``work()`` into ``folder`` unless a ``stage.json`` there has the same config; returns the metrics."""
    marker = folder / "stage.json"
    if marker.is_file() and not fresh:
        done = json.loads(marker.read_text())
        if done.get("config") == json.loads(json.dumps(conf, default=str)):
            log(f"{name}: done earlier, skipped")
            return done["metrics"]
    on_rank0(lambda: stage_folder(folder, clear=True))
    log(f"{name} ...")
    t0 = time.perf_counter()
    metrics = work()
    record = {"stage": name, "status": "ran", "seconds": round(time.perf_counter() - t0, 2), **_rss_mb(),
              "config": json.loads(json.dumps(conf, default=str)), "metrics": metrics}  # fmt: skip
    on_rank0(lambda: _atomic_json(marker, record))
    log(f"{name}: {record['seconds']:.1f}s")
    return metrics


def _seed_run(cfg: Any, post: str, c: Any, out: Path, fresh: bool, show: bool, log: Any) -> dict[str, Any]:
    """Train ``post`` with config ``c`` (a seed set) and evaluate it; returns the eval record."""
    base = out / "seeds" / str(c.train.seed)
    model = base / post / "model"
    _run_once(
        f"seed {c.train.seed}: {post}", base / post, _config_dict(c), fresh,
        lambda: _stage_post(post, c, base / post, show, resume=True), log,
    )  # fmt: skip
    return _run_once(
        f"seed {c.train.seed}: eval_{post}", base / f"eval_{post}",
        {"eval": _config_dict(cfg.eval), "model": str(model)}, fresh,
        lambda: _stage_eval(model, out / "data" / "world", cfg.eval, base / f"eval_{post}"), log,
    )  # fmt: skip


def run_seeds(
    cfg: Any,
    configs: dict[str, Any],
    stages: dict[str, dict[str, Any]],
    out: Path,
    seeds: int,
    *,
    fresh: bool,
    show_progress: bool,
    log: Any,
) -> dict[str, list[dict[str, Any]]]:
    """``{post: [{"seed", change keys ...}]}`` over ``seeds`` training seeds (run 0 from ``stages``)."""
    from rl import report

    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    sft = report.model_summary(stages["eval_sft"]["metrics"])
    runs: dict[str, list[dict[str, Any]]] = {}
    for post in cfg.post:
        s0 = configs[post].train.seed
        rows = []
        for k in range(seeds):
            seed = s0 + k
            if k == 0:
                ev = stages[f"eval_{post}"]["metrics"]
            else:
                ev = _seed_run(cfg, post, _with_seed(configs[post], seed), out, fresh, show_progress, log)
            d = report.changes(sft, report.model_summary(ev))
            rows.append({"seed": seed, **{key: d.get(key) for key, _, _ in SEED_KEYS}})
        runs[post] = rows
    return runs
