"""How well a tiles policy reads the tray's tiles: each tile's entry against the truth, from transcripts.

    python benchmarks/tile_reading.py runs/t0 runs/t1 [--models tool_sft tool_grpo]

A policy trained with ``data.detail_zoom: tiles`` or ``photo_tiles`` answers a detail task by first saying
what each tile of the tray holds ("tile 1: empty. tile 2: a red cup. ..."). For each detail task of
``OUT/eval/<model>.transcripts.md`` (``eval.transcripts`` per kind, written by ``rl agent``) whose tray
call is the demonstrations' own (the asked photo, the padded tray box, grid 3), the entries of the last
inventory are set against :func:`rl.agent.world_demos.tile_inventory`: empty tiles said empty, and for
tiles that hold an object, its category and its colour; tasks whose call missed the tray, or that wrote
no inventory, are counted apart. The world (seed, ``detail`` settings) is read from each run's
``config.yaml``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

_TASK = re.compile(r"\[task aw\d+-(\d+)/detail\]")
_ENTRY = re.compile(r"tile (\d): ([^.]*)\.")
_INVENTORY = re.compile(r"\[policy \d+\] (tile 1:.*)")


def entry_scores(truth: dict[str, str], said: dict[str, str]) -> Counter:
    """Counts for one inventory: ``empty_right`` / ``empty_tiles``, ``category_right`` / ``colour_right``
    / ``both_right`` over ``object_tiles`` (an entry not written counts as wrong)."""
    c: Counter = Counter()
    for k, want in truth.items():
        got = said.get(k, "")
        if want == "empty":
            c["empty_tiles"] += 1
            c["empty_right"] += got == "empty"
            continue
        c["object_tiles"] += 1
        w, g = want.split(), got.split()
        c["category_right"] += g[-1:] == w[-1:]
        c["colour_right"] += g[-2:-1] == w[-2:-1]
        c["both_right"] += got == want
    return c


def run_scores(run: Path, model: str) -> Counter:
    from mm.config import load_config
    from rl.agent.config import AgentRunConfig
    from rl.agent.world_demos import tile_inventory, tray_box, zoom_call
    from rl.agent.world_tasks import detail_task, world_note

    path = run / "eval" / f"{model}.transcripts.md"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run rl agent on {run} first")
    world = load_config(AgentRunConfig, run / "config.yaml").world
    c: Counter = Counter()
    for block in path.read_text().split("\n\n"):
        m = _TASK.match(block)
        if not m:
            continue
        task = detail_task(world, world_note(world, int(m.group(1))))
        call = {
            **zoom_call(task, task.meta["image"], tray_box(task, task.meta["tray"])),
            "name": "tiles",
            "grid": 3,
        }
        c["tasks"] += 1
        said = _INVENTORY.findall(block)
        if json.dumps(call)[1:-1] not in block:
            c["tray_missed"] += 1
        elif not said:
            c["no_inventory"] += 1
        else:
            truth = dict(_ENTRY.findall(tile_inventory(task, call)))
            c += entry_scores(truth, dict(_ENTRY.findall(said[-1])))
    return c


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="rl agent output folders")
    parser.add_argument("--models", nargs="+", default=["tool_sft", "tool_grpo"])
    args = parser.parse_args(argv)
    for model in args.models:
        c = sum((run_scores(run, model) for run in args.runs), Counter())
        n, e = c["object_tiles"], c["empty_tiles"]
        print(
            f"{model}: {c['tasks']} detail tasks, tray missed {c['tray_missed']}, no inventory "
            f"{c['no_inventory']}; object tiles {n}: category {c['category_right']}/{n}, colour "
            f"{c['colour_right']}/{n}, both {c['both_right']}/{n}; "
            f"empty tiles said empty {c['empty_right']}/{e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
