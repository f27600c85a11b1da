"""One table over several ``rl agent`` runs: their held-out rows pooled (e.g. one run per world).

    python -m rl.agent.pool runs/agent0 runs/agent1 runs/agent2 --out runs/agent_pooled

Each run's eval rows (``OUT/eval/<model>.jsonl``) are concatenated per model, in the order the runs are
given, and judged as one report (``rl.agent.report.compare_models``: bootstrap 95% intervals over the
pooled tasks, paired gains, the targets); writes ``--out``/report.md and report.json. The runs must
evaluate disjoint tasks (different worlds, or different eval seeds): a task id twice is an error.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mm.errors import UserError
from mm.train.metrics import atomic_write_text
from rl.agent.report import compare_models, markdown, model_rows

MODELS = ("notool_sft", "tool_sft", "tool_grpo")
"""The models every run evaluates (``rl.agent.run.MODELS``)."""
OPTIONAL = ("tool_ppo",)
"""Models a run evaluates when trained (``rl.agent.run.models_of``): pooled when every run has them."""


def pooled_rows(runs: Sequence[Path]) -> dict[str, list[dict[str, Any]]]:
    """Every model's rows of ``runs``, concatenated in run order."""
    if not runs:
        raise UserError("give at least one rl agent run folder to pool")
    models = pooled_models(runs)
    pooled: dict[str, list[dict[str, Any]]] = {m: [] for m in models}
    for run in runs:
        missing = [m for m in MODELS if not (run / "eval" / f"{m}.jsonl").exists()]
        if missing:
            raise UserError(f"{run} has no eval rows for {missing}; run `rl agent` there to its eval stage")
        for m, rows in model_rows(run, models).items():
            pooled[m] += rows
    ids = [r["task_id"] for r in pooled["tool_grpo"]]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise UserError(f"the runs evaluate some tasks twice ({twice[:3]}...); pool runs of different worlds")
    return pooled


def pooled_models(runs: Sequence[Path]) -> list[str]:
    """:data:`MODELS`, plus each :data:`OPTIONAL` model every run evaluated."""
    return [*MODELS, *(m for m in OPTIONAL if all((r / "eval" / f"{m}.jsonl").exists() for r in runs))]


def pool_report(runs: Sequence[Path], *, n_boot: int = 1000) -> dict[str, Any]:
    """The pooled report of ``runs`` (the ``report.json`` form, without stage times)."""
    rows = pooled_rows(runs)
    seeds = sorted({r["seed"] for r in rows["tool_grpo"]})
    per = {}
    for r in rows["tool_grpo"]:
        per[(r["seed"], r["kind"])] = per.get((r["seed"], r["kind"]), 0) + 1
    return {"runs": [str(r) for r in runs], "seeds": seeds, "tasks_per_kind": max(per.values()),
            **compare_models(rows, n_boot)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.agent.pool", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="rl agent output folders")
    parser.add_argument("--out", type=Path, required=True, help="folder for report.md and report.json")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    args = parser.parse_args(argv)
    report = pool_report(args.runs, n_boot=args.n_boot)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "report.json", json.dumps(report, indent=1))
    atomic_write_text(args.out / "report.md", markdown(report, list(report["metrics"])))
    print(f"[agent pool] {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
