"""World detail tasks written as a task file (``rl.agent.task_file``): an example of the format, made of
photos, and a check that ``rl agent`` trains on a file as it does on the world.

    python -m rl.agent.task_export --out tasks/world0 --split train --tasks 256
    python -m rl.agent.task_export --out tasks/world0 --split test --tasks 64 --start 200
    python -m rl.agent.task_export --config configs/rl/agent_world.yaml --out tasks/aw0 --tasks 512

``--config``: the world of an ``rl agent`` config (its ``world`` section, e.g. trays at 3 x 3 spots) and
its ``data.detail_zoom``; ``--seed`` and ``--zoom`` override them.

Writes ``OUT/<split>.jsonl`` and ``OUT/images/<note>-<k>.png`` (photo ``k`` of each note at its full
resolution). Each line holds the question, the asked value as the answer (``match`` exact), the world
demonstration's tool calls (``--zoom``: where it zooms, ``rl.agent.world_demos.DETAIL_ZOOMS``) with the
value alone as its answer, and ``where`` (the asked objects' photo and box), so the eval reports
``zoom_on_target/qa``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from dataclasses import replace
from pathlib import Path

from rl.agent.task import AgentTask
from rl.agent.world_demos import DETAIL_ZOOMS, ZOOM_TOOL_MODULES, checked_call, demonstration
from rl.agent.world_tasks import SPLITS, WorldTaskConfig, world_tasks


def unrun_call(call: dict, task: AgentTask) -> tuple[str, None]:
    """A demonstration's ``call`` checked as the loop parses it, not run (a file keeps the calls only, and a
    tool may need what only a run has: ``find``'s namer)."""
    checked_call(call, task)
    return "", None


def task_record(task: AgentTask, images: list[str], zoom: str) -> dict:
    """One task file line for world detail ``task`` whose photos are saved at ``images``."""
    if task.kind != "detail":
        raise ValueError(f"only detail tasks have one exact answer; {task.task_id!r} is {task.kind!r}")
    demo = demonstration(task, unrun_call, detail_zoom=zoom)
    calls = [t.call for t in demo if t.policy and t.call is not None]
    H, W = task.sources[task.meta["image"] - 1].shape[:2]
    x0, y0, x1, y1 = task.meta["box"]  # source pixels, ends exclusive
    return {
        "id": task.task_id, "image": images, "question": task.question, "answer": task.answer,
        "demo": calls, "where": {"image": task.meta["image"], "box": [x0 / W, y0 / H, x1 / W, y1 / H]},
    }  # fmt: skip


def export_tasks(
    world: WorldTaskConfig, out: Path, split: str, n: int, *, start: int = 0, zoom: str = "tray"
) -> Path:
    """Write the first ``n`` detail tasks of ``split`` from world note ``start`` on (``world_tasks``: an index
    over both splits) to ``out`` (module docstring)."""
    from PIL import Image

    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for task in world_tasks(world, "detail", split, n, start):
        names = []
        for k, source in enumerate(task.sources, 1):
            name = f"images/{task.meta['note']}-{k}.png"
            Image.fromarray(source).save(out / name)
            names.append(name)
        lines.append(json.dumps(task_record(task, names, zoom)))
    path = out / f"{split}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rl.agent.task_export", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--split", default="train", choices=SPLITS)
    parser.add_argument("--tasks", type=int, default=64, help="detail tasks to write")
    parser.add_argument("--start", type=int, default=0, help="first world note index (over both splits)")
    parser.add_argument("--config", default=None, help="an rl agent YAML whose world and detail_zoom to take")
    parser.add_argument("--seed", type=int, default=None, help="world seed (default: the config's, else 0)")
    parser.add_argument("--zoom", default=None, choices=DETAIL_ZOOMS, help="where the demonstrations zoom")
    args = parser.parse_args(argv)
    world, zoom = WorldTaskConfig(), "tray"
    if args.config:
        from mm.config import load_config
        from rl.agent.config import AgentRunConfig

        cfg = load_config(AgentRunConfig, args.config)
        world, zoom = cfg.world, cfg.data.detail_zoom
    world = replace(world, seed=world.seed if args.seed is None else args.seed)
    zoom = args.zoom or zoom
    if zoom in ZOOM_TOOL_MODULES:  # an opt-in tool the demonstrations call
        importlib.import_module(ZOOM_TOOL_MODULES[zoom])
    path = export_tasks(world, Path(args.out), args.split, args.tasks, start=args.start, zoom=zoom)
    print(f"[task_export] {args.tasks} tasks: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
