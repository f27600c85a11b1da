"""Where an agent's detail answers are lost: finding the place, or reading it. From a run's eval rows.

    python benchmarks/zoom_aim.py runs/agent0 runs/agent1 runs/agent2 [--models tool_sft tool_grpo]

Each held-out detail task's row (``OUT/eval/<model>.jsonl``, written by ``rl agent``) says whether the first
tool call zoomed where the answer is (``zoom_on_target``, ``rl.agent.scoring.zoom_on_target``) and how many
photos the note has (``photos``). Per model, over the given runs together:

- the share of first zooms on target, for notes of 1, 2 and 3 photos: a policy that finds the tray of a
  one-photo note and loses it in three-photo notes has trouble telling the photos apart, not the place;
- detail accuracy when the first zoom is on target and when it is not: reading against guessing;
- where the first zoom went instead, for notes of 1, 2 and 3 photos (rows with the ``aim`` field): elsewhere
  in the asked photo (``other_place``: the place was not found), another photo (``other_photo``: the
  photos were not told apart), another thing (``other_thing``: a ``find`` for something else), or no zoom.

Rows written before those fields existed have neither: delete the run's ``eval/*.jsonl`` and run the same
``rl agent`` command again (every trained stage is skipped; the eval and the report are redone, and the
greedy rows come out the same apart from the added fields).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl.agent.scoring import AIMS


def detail_rows(runs: Sequence[Path], model: str) -> list[dict[str, Any]]:
    """The detail rows of ``model`` in every run (an error when a row lacks the fields read here)."""
    rows = []
    for run in runs:
        path = run / "eval" / f"{model}.jsonl"
        if not path.exists():
            raise SystemExit(f"{path} is missing: run rl agent on {run} first")
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["kind"] != "detail":
                continue
            if "zoom_on_target" not in row or "photos" not in row:
                raise SystemExit(f"{path} predates zoom_on_target; redo the eval (this script's docstring)")
            rows.append(row)
    return rows


def aim_table(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """On-target share per photo count, and accuracy on / off target (``[hits, tasks]`` pairs)."""
    by_photos: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    by_aim: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        by_photos[r["photos"]][0] += r["zoom_on_target"]
        by_photos[r["photos"]][1] += 1
        aim = "on_target" if r["zoom_on_target"] else "off_target"
        by_aim[aim][0] += r["correct"]
        by_aim[aim][1] += 1
    out = {
        "tasks": len(rows),
        "on_target_by_photos": {n: by_photos[n] for n in sorted(by_photos)},
        "accuracy": {k: by_aim[k] for k in ("on_target", "off_target") if k in by_aim},
    }
    if all("aim" in r for r in rows):  # rows written before the field have zoom_on_target only
        aims: dict[int, Counter] = defaultdict(Counter)
        for r in rows:
            aims[r["photos"]][r["aim"]] += 1
        out["aim_by_photos"] = {n: {a: aims[n][a] for a in AIMS} for n in sorted(aims)}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="rl agent run folders (pooled)")
    parser.add_argument("--models", nargs="+", default=["tool_sft", "tool_grpo"], help="evaluated models")
    args = parser.parse_args(argv)
    out = {model: aim_table(detail_rows(args.runs, model)) for model in args.models}
    for model, t in out.items():
        aims = ", ".join(f"{n} photo(s) {int(h)}/{int(k)}" for n, (h, k) in t["on_target_by_photos"].items())
        acc = ", ".join(f"{a.replace('_', ' ')} {h:.0f}/{k:.0f} right" for a, (h, k) in t["accuracy"].items())
        print(f"{model}: first zoom on target: {aims}; {acc}")
        for n, counts in t.get("aim_by_photos", {}).items():
            print(f"  {n} photo(s): " + ", ".join(f"{a.replace('_', ' ')} {k}" for a, k in counts.items()))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
