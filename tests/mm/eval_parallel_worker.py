"""Run by tests/mm/test_eval_byo.py under ``torchrun --nproc_per_node 2``: the ranks' results of
:func:`mm.eval.parallel.strided_map` come back in item order, and a rank that fails stops every rank.

    python -m torch.distributed.run --nproc_per_node 2 -m tests.mm.eval_parallel_worker OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mm.errors import UserError
from mm.eval.parallel import join_eval, rank_world, strided_map


def main() -> None:
    out = Path(sys.argv[1])
    join_eval(None)
    rank, world = rank_world()
    seen: list[int] = []

    def square(items):
        seen.extend(items)
        return [i * i for i in items]

    results = strided_map(square, 7)

    def fail_on_rank_1(items):
        if rank == 1:
            raise MemoryError("out of memory on this one")
        return list(items)

    try:
        strided_map(fail_on_rank_1, 4)
        error = None
    except (UserError, MemoryError) as e:
        error = f"{type(e).__name__}: {e}"
    row = {"rank": rank, "world": world, "results": results, "seen": seen, "error": error}
    out.with_name(f"{out.stem}{rank}.json").write_text(json.dumps(row))


if __name__ == "__main__":
    main()
