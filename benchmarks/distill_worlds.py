"""The distillation evidence over several worlds: reads the ``distill_evidence.py`` output of each world
and prints, per world and run, the share of the student-teacher gap closed on CHAIR_i and recall (paired
bootstrap intervals over held-out notes), each run minus off-policy KD (paired), the mean over worlds
with a 95% Student-t interval, and whether the target holds:

    on-policy distillation (``--opd``, default ``opd``) closes >= ``--target`` of the gap on CHAIR_i and
    on recall, and closes more of it than off-policy KD (``kd``) on both.

    python benchmarks/distill_worlds.py --runs 0=runs/opd/w0 1=runs/opd/w1 2=runs/opd/w2 \\
        --opd opd_forward --out runs/opd/worlds.json

Each ``WORLD=DIR[,DIR...]`` names ``distill_evidence.py --out DIR`` folders (their evidence.json) of one
world's student, teacher and held-out notes; several folders (methods run in separate processes) are
merged note by note. A method's runs over training seeds are averaged within a world first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rl.pipeline_table import t_interval

METRICS = ("chair_i", "recall")
"""The gaps the target is about."""


def world_means(evidence: dict[str, Any], method: str) -> dict[str, float] | None:
    """Mean over a world's training seeds of the share of the gap ``method`` closes, per metric (None when
    the world has no run of it)."""
    runs = [g for k, g in evidence["gap_closed"].items() if k.startswith(f"{method}_seed")]
    if not runs:
        return None
    return {m: sum(g[m]["value"] for g in runs) / len(runs) for m in METRICS}


def merge(parts: list[dict[str, Any]], where: str = "") -> dict[str, Any]:
    """One evidence dict from several ``distill_evidence.py`` outputs of the same world (methods run in
    separate processes): their per-note units merged, every summary recomputed from them."""
    import distill_evidence

    units: dict[str, Any] = {}
    for part in parts:
        if "units" not in part:
            raise ValueError(f"{where}: an evidence.json without per-note units; rerun distill_evidence.py")
        for key, u in part["units"].items():
            if key in ("student", "teacher") and key in units and units[key] != u:
                raise ValueError(
                    f"{where}: the folders disagree on the {key}'s captions (another world, student, teacher "
                    "or --eval-notes?); merge only one world's runs"
                )
            units.setdefault(key, u)
    methods = sorted({k.partition("_seed")[0] for k in units if "_seed" in k})
    result: dict[str, Any] = {"runs": {}}
    distill_evidence.summarize(result, units, methods)
    return result


def aggregate(worlds: dict[str, dict[str, Any]], *, opd: str = "opd", target: float = 0.5) -> dict[str, Any]:
    """Per world and over worlds: gap closed by ``opd`` (a method of distill_evidence.py) and ``kd``, their
    difference, and the verdict.

    ``worlds``: world name -> its evidence.json. Returns ``{"per_world": {world: {"opd"|"kd": {metric:
    share}, "opd_minus_kd": {metric: share}, "holds": bool}}, "mean": {key: {metric: {"mean", "t95"}}},
    "holds_at_mean": bool, "holds_every_world": bool}``; the target holds where OPD's share is >= ``target``
    on both metrics and above KD's on both.
    """
    if not worlds:
        raise ValueError("no worlds given: pass WORLD=DIR pairs of distill_evidence.py output folders")
    per_world: dict[str, Any] = {}
    for name, ev in worlds.items():
        row: dict[str, Any] = {"opd": world_means(ev, opd), "kd": world_means(ev, "kd")}
        if row["opd"] is None or row["kd"] is None:
            have = sorted(ev["gap_closed"])
            raise ValueError(
                f"world {name}: its evidence needs {opd} and kd runs (has: {have}); run distill_evidence.py "
                f"--methods {opd} kd"
            )
        row["opd_minus_kd"] = {m: row["opd"][m] - row["kd"][m] for m in METRICS}
        row["holds"] = holds(row["opd"], row["kd"], target)
        per_world[name] = row
    mean: dict[str, Any] = {}
    for method in ("opd", "kd", "opd_minus_kd"):
        mean[method] = {}
        for m in METRICS:
            values = [row[method][m] for row in per_world.values()]
            mean[method][m] = {"mean": sum(values) / len(values), "t95": t_interval(values)}
    means = {k: {m: mean[k][m]["mean"] for m in METRICS} for k in ("opd", "kd")}
    return {
        "opd": opd,
        "target": target,
        "per_world": per_world,
        "mean": mean,
        "holds_at_mean": holds(means["opd"], means["kd"], target),
        "holds_every_world": all(row["holds"] for row in per_world.values()),
    }


def holds(opd: dict[str, float], kd: dict[str, float], target: float) -> bool:
    """OPD closes >= ``target`` of both gaps and more than KD on both."""
    return all(opd[m] >= target and opd[m] > kd[m] for m in METRICS)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def _ci(g: dict[str, Any]) -> str:
    return f"{_fmt(g['value'])} [{_fmt(g['low'])}, {_fmt(g['high'])}]"


def print_table(worlds: dict[str, dict[str, Any]], agg: dict[str, Any]) -> None:
    """Per-run shares with their intervals, the OPD - KD differences, the means over worlds."""
    print(f"{'world':<6} {'run':<10} {'CHAIR_i gap closed [95%]':<26} {'recall gap closed [95%]':<26}")
    for name, ev in worlds.items():
        for run, g in ev["gap_closed"].items():
            print(f"{name:<6} {run:<10} {_ci(g['chair_i']):<26} {_ci(g['recall']):<26}")
        for run, d in ev.get("minus_kd", {}).items():
            print(f"{name:<6} {run[:7] + '-kd':<10} {_ci(d['chair_i']):<26} {_ci(d['recall']):<26}")
        print(f"{name:<6} target {'holds' if agg['per_world'][name]['holds'] else 'does not hold'}")
    for method, row in agg["mean"].items():
        cells = []
        for m in METRICS:
            ci = row[m]["t95"]
            cells.append(
                f"{_fmt(row[m]['mean'])} [{_fmt(ci[0]) if ci else 'n/a'}, {_fmt(ci[1]) if ci else 'n/a'}]"
            )
        print(f"{'mean':<6} {method:<10} {cells[0]:<26} {cells[1]:<26}")
    print(f"target ({agg['opd']} >= {agg['target']:.2f} on both gaps and above kd on both): "
          f"{'holds' if agg['holds_at_mean'] else 'does not hold'} at the mean, "
          f"{'holds' if agg['holds_every_world'] else 'does not hold'} in every world")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="+", required=True, metavar="WORLD=DIR[,DIR...]",
                   help="distill_evidence.py output folders per world, e.g. 0=runs/opd/w0")  # fmt: skip
    p.add_argument("--opd", default="opd", help="the on-policy method judged against kd (a METHODS key)")
    p.add_argument("--target", type=float, default=0.5, help="share of each gap OPD must close")
    p.add_argument("--out", default=None, help="write the aggregate as JSON here")
    args = p.parse_args(argv)
    worlds = {}
    for item in args.runs:
        name, sep, folders = item.partition("=")
        paths = [Path(f) / "evidence.json" for f in folders.split(",")]
        if not sep or not all(p_.is_file() for p_ in paths):
            p.error(f"--runs {item!r}: expected WORLD=DIR[,DIR...], each DIR with an evidence.json (from "
                    "distill_evidence.py)")  # fmt: skip
        parts = [json.loads(p_.read_text()) for p_ in paths]
        worlds[name] = parts[0] if len(parts) == 1 else merge(parts, where=f"world {name}")
    agg = aggregate(worlds, opd=args.opd, target=args.target)
    print_table(worlds, agg)
    if args.out:
        Path(args.out).write_text(json.dumps(agg, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
