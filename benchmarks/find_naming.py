"""How fast ``find``'s namer names the regions of a stage's tasks: call by call, as find's calls ask, against
:func:`rl.agent.find.prepare`, every photo's regions ahead in full batches.

    python benchmarks/find_naming.py                      # 256 train tasks of the agent world, median of 3
    python benchmarks/find_naming.py --tasks 64 --runs 1 --model runs/tq0/note_model/tune/model

Tasks: the first ``--tasks`` train tasks of ``configs/rl/agent_world.yaml``'s world and mix (its trays,
details, changes, captions and dialogues). The namer is ``--model`` (a model folder), by default a random
NoteVLM of the agent policy's spec (the same sizes and cost as a trained one; its words are noise). Each run
starts from an empty cache:

- ``per call``: one namer call per photo, that photo's regions (what a demonstration's or rollout's find
  calls ask, one call at a time: a batch of a photo's few regions);
- ``prepare``: :func:`rl.agent.find.prepare` over all the tasks (one process: every region of every photo,
  ``--batch`` cut-outs a ``generate``).

Prints the median wall seconds of ``--runs`` runs of each, the ratio prepare / per call, and whether both
gave every region the same name (they must: a batch's names are those asked one at a time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/rl/agent_world.yaml"


def random_model(folder: Path) -> Path:
    """A random NoteVLM of the agent policy's spec, saved with its processor in ``folder``."""
    import torch

    from mm.config import load_config
    from mm.model.factory import build_notevlm, load_notevlm_spec
    from rl.agent.config import AgentRunConfig

    cfg = load_config(AgentRunConfig, CONFIG, [])
    torch.manual_seed(0)
    model, processor = build_notevlm(load_notevlm_spec(ROOT / cfg.policy.spec, list(cfg.policy.overrides)))
    model.save_pretrained(str(folder))
    processor.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128, help="the namer's batch size (cut-outs a generate)")
    ap.add_argument("--model", default=None, help="a model folder (default: a random NoteVLM, agent spec)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import torch

    import rl.agent.find as find_tool
    from mm.config import load_config
    from rl.agent.config import AgentRunConfig
    from rl.agent.world_tasks import mixed_tasks

    torch.set_num_threads(args.threads)
    cfg = load_config(AgentRunConfig, CONFIG, [])
    tasks = list(mixed_tasks(cfg.world, "train", args.tasks, tuple(cfg.data.mix)))
    each = [(t, j) for t in tasks for j in range(1, len(t.sources) + 1)]
    photos = [[crop for _, crop in find_tool.regions(t, j)] for t, j in each]
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or random_model(Path(tmp) / "model")
        warm = find_tool.model_namer(model, batch_size=args.batch)
        warm(photos[0][:1])  # the model loads once, before any timing (the OS caches its files)

        def per_call() -> dict[bytes, str]:
            namer = find_tool.model_namer(model, batch_size=args.batch)
            for crops in photos:
                namer(crops)
            return namer.cache

        def prepared() -> dict[bytes, str]:
            namer = find_tool.model_namer(model, batch_size=args.batch)
            before = find_tool.set_namer(namer)
            try:
                find_tool.prepare(tasks)
            finally:
                find_tool.set_namer(before)
            return namer.cache

        times: dict[str, list[float]] = {"per call": [], "prepare": []}
        names: dict[str, dict[bytes, str]] = {}
        for _ in range(args.runs):
            for label, fn in (("per call", per_call), ("prepare", prepared)):
                t = time.perf_counter()
                names[label] = fn()
                times[label].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "tasks": len(tasks),
        "photos": len(photos),
        "regions": len(names["prepare"]),
        "calls": len(photos),
        "seconds": med,
        "ratio": med["prepare"] / med["per call"],
        "same_names": names["prepare"] == names["per call"],
    }
    print(f"{result['tasks']} tasks, {result['photos']} photos, {result['regions']} distinct regions")
    print("| namer | median s | per region ms |\n|---|---|---|")
    for label, s in med.items():
        print(f"| {label} | {s:.2f} | {1000 * s / max(1, result['regions']):.2f} |")
    print(f"prepare / per call: {result['ratio']:.2f}x; same names: {result['same_names']}")
    return result


if __name__ == "__main__":
    main()
