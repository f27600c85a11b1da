"""Run by tests/rl/test_agent_find.py under ``torchrun --nproc_per_node 2``: ``rl.agent.find.prepare`` shares
the naming out over the ranks, each region named once, and every rank ends with every name.

    python -m torch.distributed.run --nproc_per_node 2 -m tests.rl.agent_find_dp_worker OUT.json

Rank 0 writes what each rank named and holds to OUT.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import rl.agent.find as find_tool
from rl.agent.parallel import gathered, join, rank_world
from tests.rl.agent_helpers import painted_namer, tray_detail_tasks


def main(out: Path) -> None:
    join(torch.device("cpu"))
    rank, world = rank_world()
    tasks = tray_detail_tasks(4)
    named: list[int] = []
    namer = painted_namer(find_tool, named)
    find_tool.set_namer(namer)
    find_tool.prepare(tasks)
    before = sum(named)
    said = [getattr(find_tool.find(t, 1, "tiny"), "text", "") for t in tasks]
    mine = {"rank": rank, "named": before, "after_find": sum(named) - before,
            "cache": sorted(k.hex() + v for k, v in namer.cache.items()), "said": said}  # fmt: skip
    ranks = gathered([mine])
    if rank == 0:
        alone = painted_namer(find_tool)
        find_tool.set_namer(alone)
        truth = [getattr(find_tool.find(t, 1, "tiny"), "text", "") for t in tasks]
        regions = {
            alone.key(c)
            for t in tasks
            for j in range(1, len(t.sources) + 1)
            for _, c in find_tool.regions(t, j)
        }
        result = {"world": world, "ranks": ranks, "alone": len(regions), "truth": truth}
        out.write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
