"""imgdiff kernel timings on decoded 4K arrays: every backend x mode x pair, as ratios to L.

L is ``np.array_equal(a, b)`` on the identical pair (one full read of both images, the physical
floor; on a differing pair NumPy may stop early, so the identical pair's figure is used for all).
Pairs come from `tests/imgdiff/cases.py` (seeded): ``identical``, ``small_patch`` (a few pixels) and
``jpeg_q90`` (B is A after a JPEG q90 round trip: almost every pixel differs). Each figure is the
median of ``--runs`` timed calls after one warm-up call (which also compiles / loads Numba's cache).
``cuda`` is included only when ``numba.cuda.is_available()``.

Usage: ``python benchmarks/imgdiff_kernels.py [--runs 5] [--width 3840 --height 2160]
[--backends numpy,numba,cuda] [--modes exact,robust]``
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from imgdiff_bench import median_time  # same folder: benchmarks/ (puts the repo root on sys.path)

from imgdiff import diff
from tests.imgdiff.cases import make_case

PAIRS = ("identical", "small_patch", "jpeg_q90")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs per figure (median), default 5")
    ap.add_argument("--width", type=int, default=3840)
    ap.add_argument("--height", type=int, default=2160)
    ap.add_argument("--backends", default="numpy,numba,cuda", help="comma list of numpy,numba,cuda")
    ap.add_argument("--modes", default="exact,robust", help="comma list of exact,robust")
    args = ap.parse_args(argv)
    backends = args.backends.split(",")
    if "cuda" in backends:
        from numba import cuda

        if not cuda.is_available():
            print("# cuda: no GPU here, skipped", file=sys.stderr)
            backends.remove("cuda")
    modes = args.modes.split(",")
    pairs = {n: make_case(n, h=args.height, w=args.width) for n in PAIRS}
    same = pairs["identical"]
    L = median_time(lambda: np.array_equal(same.a, same.b), args.runs)  # a full read of both (no early exit)
    floor = dict.fromkeys(PAIRS, L)
    print(f"# {args.width}x{args.height} RGB uint8, median of {args.runs} runs; ratio = time / L")
    print("| backend/mode | " + " | ".join(PAIRS) + " |")
    print("|---|" + "---|" * len(PAIRS))
    print(f"| L (np.array_equal, identical pair) | {L * 1e3:.1f} ms | | |")
    for backend in backends:
        for mode in modes:
            cells = []
            for n, c in pairs.items():
                t = median_time(lambda c=c, m=mode, be=backend: diff(c.a, c.b, mode=m, backend=be), args.runs)
                cells.append(f"{t * 1e3:.1f} ms ({t / floor[n]:.1f}xL)")
            print(f"| {backend}/{mode} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
