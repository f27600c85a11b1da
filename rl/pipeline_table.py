"""``rl pipeline --world-seeds W... [--seeds N]``: the pipeline per world seed, and one table over every run.

    rl pipeline --config configs/rl/pipeline_nogt.yaml --out runs/nogt_table --world-seeds 0 1 2 --seeds 2

World seed ``w`` runs (or resumes) the whole pipeline in ``OUT/world<w>`` with the world config's
``seed=w`` and ``N`` training seeds for post-training (:mod:`rl.pipeline_seeds`). Then
``OUT/table.md`` and ``OUT/table.json`` hold, per post-training method, every run (world seed x
training seed) with its changes against that world's SFT model, their mean +- sample sd, a 95% Student-t
interval of the mean, and which targets hold (:data:`TARGETS`): at the mean, over the whole interval, and
with no run cutting CHAIR_i by less than :data:`MIN_RUN_CHAIR_CUT`. ``--table-only`` writes the table
from the runs already in OUT; ``--against DIR`` adds the difference of the means from the table in DIR
(the no-ground-truth table against the ground-truth one: the cost of dropping ground truth).

Runs are read back from each world folder's eval records: the main run's ``eval_<post>/eval.json`` and
each further training seed's ``seeds/<seed>/eval_<post>/eval.json``, against ``eval_sft/eval.json``
(:func:`rl.report.model_summary`, :func:`rl.report.changes`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from mm.errors import UserError

TABLE_KEYS: tuple[tuple[str, str, str], ...] = (
    ("chair_i_rel_change", "CHAIR_i change (rel.)", "{:+.1%}"),
    ("attribute_rate_rel_change", "attribute halluc. change (rel.)", "{:+.1%}"),
    ("recall_change_points", "recall change (points)", "{:+.1f}"),
    ("length_change_pct", "length change (%)", "{:+.1f}"),
    ("pope_adversarial_f1_change_points", "POPE-adv F1 change (points)", "{:+.1f}"),
)
"""(change key of :func:`rl.report.changes`, header, format) of the table's columns."""

TARGETS: dict[str, tuple[str, Callable[[float], bool]]] = {
    "chair_i_rel_change": ("<= -50%", lambda x: x <= -0.50),
    "attribute_rate_rel_change": ("<= -30%", lambda x: x <= -0.30),
    "recall_change_points": (">= -2 points", lambda x: x >= -2.0),
    "length_change_pct": ("within +-10%", lambda x: abs(x) <= 10.0),
    "pope_adversarial_f1_change_points": ("within +-1 point", lambda x: abs(x) <= 1.0),
}
"""Change key -> (goal, test) of the post-training targets, checked on the mean over runs."""

MIN_RUN_CHAIR_CUT = -0.45
"""Every run must cut CHAIR_i at least this much (relative change <= -45%)."""

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)  # fmt: skip
"""97.5% quantiles of Student's t with 1..20 degrees of freedom."""


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` >= 1 degrees of freedom (a table to 20, then the
    Cornish-Fisher expansion around the normal quantile, within 1e-3)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def t_interval(values: list[float]) -> list[float] | None:
    """95% Student-t interval of the mean of ``values`` (None with fewer than two)."""
    if len(values) < 2:
        return None
    m, sd = statistics.fmean(values), statistics.stdev(values)
    half = t_quantile(len(values) - 1) * sd / math.sqrt(len(values))
    return [m - half, m + half]


# ---------------------------------------------------------------- reading the runs back


def _read_eval(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path} is missing: run the pipeline for that world seed (without --table-only)")
    return json.loads(path.read_text())


def _main_seed(world_dir: Path, post: str) -> int | None:
    marker = world_dir / post / "stage.json"
    if not marker.is_file():
        return None
    return json.loads(marker.read_text())["config"]["train"]["seed"]


def collect_runs(world_dirs: dict[int, Path], post: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``{post: [{"world_seed", "train_seed", change keys...}]}`` from the world folders' eval records (the
    main run, then ``seeds/<seed>`` in seed order); a world folder without ``eval_<post>`` is an error."""
    from rl import report

    out: dict[str, list[dict[str, Any]]] = {p: [] for p in post}
    for w, folder in sorted(world_dirs.items()):
        sft = report.model_summary(_read_eval(folder / "eval_sft" / "eval.json"))
        for p in post:
            evals = [(_main_seed(folder, p), folder / f"eval_{p}" / "eval.json")]
            extra = sorted((folder / "seeds").glob(f"*/eval_{p}/eval.json"), key=lambda q: int(q.parts[-3]))
            evals += [(int(q.parts[-3]), q) for q in extra]
            for seed, path in evals:
                d = report.changes(sft, report.model_summary(_read_eval(path)))
                out[p].append(
                    {"world_seed": w, "train_seed": seed, **{k: d.get(k) for k, _, _ in TABLE_KEYS}}
                )
    return out


# ---------------------------------------------------------------- the table


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per method: its runs, the mean, sample sd and 95% t interval of each key, and the targets (``value``:
    the mean; met at the mean, and over the whole interval: None without one), then the weakest run's
    CHAIR_i cut against :data:`MIN_RUN_CHAIR_CUT`."""
    out: dict[str, Any] = {}
    for post, rows in runs.items():
        stats: dict[str, dict[str, Any]] = {}
        for k, _, _ in TABLE_KEYS:
            vals = [r[k] for r in rows if r.get(k) is not None]
            stats[k] = {
                "n": len(vals),
                "mean": statistics.fmean(vals) if vals else None,
                "sd": statistics.stdev(vals) if len(vals) > 1 else None,
                "interval": t_interval(vals),
            }
        targets = []
        for k, (goal, test) in TARGETS.items():
            s = stats[k]
            iv = s["interval"]
            targets.append(
                {
                    "key": k,
                    "goal": goal,
                    "value": s["mean"],
                    "met": None if s["mean"] is None else bool(test(s["mean"])),
                    "met_at_interval": None if iv is None else bool(test(iv[0]) and test(iv[1])),
                }
            )
        cuts = [r["chair_i_rel_change"] for r in rows if r.get("chair_i_rel_change") is not None]
        worst = max(cuts) if cuts else None
        targets.append(
            {
                "key": "every_run_chair_i_rel_change",
                "goal": f"every run <= {MIN_RUN_CHAIR_CUT:.0%}",
                "value": worst,
                "met": None if worst is None else bool(worst <= MIN_RUN_CHAIR_CUT),
                "met_at_interval": None,
            }
        )
        out[post] = {
            "runs": rows,
            "stats": stats,
            "targets": targets,
            "targets_met": sum(1 for t in targets if t["met"]),
            "targets_total": len(targets),
        }
    return out


def _fmt(v: Any, f: str) -> str:
    return "n/a" if v is None else f.format(v)


def _yes(v: bool | None) -> str:
    return "n/a" if v is None else "yes" if v else "**no**"


def table_markdown(table: dict[str, Any], *, title: str) -> str:
    """The table as markdown: per method the mean +- sd [t interval], the targets, then every run."""
    keys = TABLE_KEYS
    lines = [
        f"# {title}",
        "",
        "Changes against each world's SFT model; mean +- sample sd over all runs, "
        "[95% Student-t interval of the mean].",
        "",
    ]
    lines += ["| method | runs | " + " | ".join(h for _, h, _ in keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for post, s in table.items():
        cells = []
        for k, _, f in keys:
            st = s["stats"][k]
            sd = _fmt(st["sd"], f.replace("+", ""))
            iv = st["interval"]
            cells.append(
                f"{_fmt(st['mean'], f)} +- {sd}"
                + ("" if iv is None else f" [{f.format(iv[0])}, {f.format(iv[1])}]")
            )
        lines.append(f"| {post} | {len(s['runs'])} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Targets",
        "",
        "| method | target | goal | value | met (mean) | met (interval) |",
        "|---|---|---|---|---|---|",
    ]
    fmts = {k: f for k, _, f in keys} | {"every_run_chair_i_rel_change": "{:+.1%}"}
    for post, s in table.items():
        for t in s["targets"]:
            lines.append(
                f"| {post} | {t['key']} | {t['goal']} | {_fmt(t['value'], fmts[t['key']])} | "
                f"{_yes(t['met'])} | {_yes(t['met_at_interval'])} |"
            )
        lines.append(f"| {post} | **met** | | {s['targets_met']} of {s['targets_total']} | | |")
    lines += [
        "",
        "## Every run",
        "",
        "| method | world seed | training seed | " + " | ".join(h for _, h, _ in keys) + " |",
        "|" + "---|" * (len(keys) + 3),
    ]
    for post, s in table.items():
        for r in s["runs"]:
            lines.append(
                f"| {post} | {r['world_seed']} | {_fmt(r['train_seed'], '{}')} | "
                + " | ".join(_fmt(r.get(k), f) for k, _, f in keys)
                + " |"
            )
    return "\n".join(lines) + "\n"


def against(table: dict[str, Any], other: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per method both tables have: this table's mean minus ``other``'s (a ``table.json``'s ``methods``), per
    key: e.g. the cost of dropping ground truth, from the table without it against the one with it."""
    out: dict[str, dict[str, float | None]] = {}
    for post in table.keys() & other.keys():
        mine, theirs = table[post]["stats"], other[post]["stats"]
        out[post] = {
            k: None if mine[k]["mean"] is None or theirs.get(k, {}).get("mean") is None
            else mine[k]["mean"] - theirs[k]["mean"]
            for k, _, _ in TABLE_KEYS
        }  # fmt: skip
    return out


def against_markdown(diff: dict[str, dict[str, float | None]], name: str) -> str:
    """Markdown section of :func:`against` (``name``: where the other table came from)."""
    keys = TABLE_KEYS
    lines = ["", f"## Against {name}", "", "Difference of the means, this table minus that one (relative "
             "changes in percentage points).", "", "| method | " + " | ".join(h for _, h, _ in keys) + " |",
             "|" + "---|" * (len(keys) + 1)]  # fmt: skip
    for post, d in sorted(diff.items()):
        cells = [_fmt(d[k], f) for k, _, f in keys]
        lines.append(f"| {post} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_table(
    out: Path, world_dirs: dict[int, Path], post: list[str], *, title: str, other: Path | None = None
) -> dict[str, Any]:
    """Collect the runs of ``world_dirs``; write ``out/table.md`` and ``out/table.json`` (with ``other``, a
    folder holding another ``table.json``, the difference of the means too); return the table."""
    from rl.pipeline_stages import _atomic_json

    table = summarize(collect_runs(world_dirs, post))
    record: dict[str, Any] = {"title": title, "world_seeds": sorted(world_dirs), "methods": table}
    text = table_markdown(table, title=title)
    if other is not None:
        path = Path(other) / "table.json"
        if not path.is_file():
            raise UserError(f"--against {other}: no table.json there; write that table first (--table-only)")
        diff = against(table, json.loads(path.read_text())["methods"])
        record["against"] = {"table": str(other), "mean_difference": diff}
        text += against_markdown(diff, str(other))
    out.mkdir(parents=True, exist_ok=True)
    _atomic_json(out / "table.json", record)
    (out / "table.md").write_text(text)
    return table


# ---------------------------------------------------------------- running the world seeds


def world_folder(out: Path, seed: int) -> Path:
    """The run folder of world seed ``seed`` in the table folder ``out``."""
    return Path(out) / f"world{seed}"


def run_table(
    cfg: Any, out: str | Path, world_seeds: list[int], *, seeds: int, table_only: bool = False,
    run: Callable[..., Any] | None = None, other: str | Path | None = None, **kwargs: Any,
) -> dict[str, Any]:  # fmt: skip
    """Run (or resume) the pipeline ``cfg`` per world seed into ``OUT/world<seed>`` with ``seeds`` training
    seeds (``run``: :func:`rl.pipeline.run_pipeline`, given ``kwargs``), then write the table (against the
    table in ``other``, when given)."""
    if not world_seeds or len(set(world_seeds)) != len(world_seeds) or min(world_seeds) < 0:
        raise UserError(f"--world-seeds {world_seeds}: give distinct seeds >= 0, e.g. --world-seeds 0 1 2")
    if not cfg.post:
        raise UserError("--world-seeds tabulates post-training; the config's post list is empty")
    out = Path(out)
    dirs = {w: world_folder(out, w) for w in world_seeds}
    if not table_only:
        for w, folder in dirs.items():
            world = replace(cfg.world, overrides=[*cfg.world.overrides, f"seed={w}"])
            run(replace(cfg, world=world), folder, seeds=seeds, **kwargs)
    kind = "ground truth" if cfg.ground_truth else "no ground truth"
    title = f"Post-training over world seeds {', '.join(map(str, world_seeds))} ({kind})"
    from mm.train.common import on_rank0

    against_dir = None if other is None else Path(other)
    return on_rank0(lambda: write_table(out, dirs, list(cfg.post), title=title, other=against_dir))
