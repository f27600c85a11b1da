"""imgdiff CUDA backend check on a real GPU: parity with NumPy on 4K pairs, then numpy/numba/cuda timings.

Self-contained (needs only this repository on ``PYTHONPATH``, NumPy, OpenCV and Numba with CUDA).
For every pair (seeded, `tests/imgdiff/cases.py`) and mode, the ``numba`` and ``cuda`` results must equal
the ``numpy`` reference :class:`imgdiff.Result` exactly (boxes, regions, counts, deltas); then each
backend is timed (median of ``--runs`` after a warm-up that also JIT-compiles) and a table of
milliseconds and ratios to L (``np.array_equal`` on the identical pair) is printed. Exit status 1 on any
mismatch, 2 when no GPU is visible, else 0.

Usage: ``PYTHONPATH=. python benchmarks/imgdiff_gpu_check.py [--runs 5] [--width 3840 --height 2160]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from imgdiff_bench import median_time  # same folder: benchmarks/

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "numba_cache"))

PAIRS = ("identical", "small_patch", "single_pixel", "bump8", "text_added", "jpeg_q90", "jpeg_q90_bump")
BACKENDS = ("numpy", "numba", "cuda")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs per figure (median), default 5")
    ap.add_argument("--width", type=int, default=3840)
    ap.add_argument("--height", type=int, default=2160)
    args = ap.parse_args(argv)
    from numba import cuda

    import imgdiff
    from tests.imgdiff.cases import make_case

    if not cuda.is_available():
        print("no CUDA GPU visible (numba.cuda.is_available() is False)", file=sys.stderr)
        return 2
    print(f"# GPU: {cuda.get_current_device().name}", flush=True)
    pairs = {n: make_case(n, h=args.height, w=args.width) for n in PAIRS}
    same = pairs["identical"]
    L = median_time(lambda: np.array_equal(same.a, same.b), args.runs)
    bad = 0
    rows = []
    for mode in ("exact", "robust"):
        for n, c in pairs.items():
            ref = imgdiff.diff(c.a, c.b, mode=mode, backend="numpy")
            cells = []
            for be in BACKENDS:
                got = imgdiff.diff(c.a, c.b, mode=mode, backend=be)
                ok = got == ref
                if not ok:
                    bad += 1
                    print(f"MISMATCH {mode}/{n}/{be}: got {got.bbox} {len(got.regions)} regions "
                          f"{got.changed_pixels} px; numpy {ref.bbox} {len(ref.regions)} regions "
                          f"{ref.changed_pixels} px", flush=True)  # fmt: skip
                t = median_time(
                    lambda c=c, m=mode, b=be: imgdiff.diff(c.a, c.b, mode=m, backend=b), args.runs
                )
                cells.append(f"{t * 1e3:.1f} ms ({t / L:.1f}xL){'' if ok else ' MISMATCH'}")
            rows.append(f"| {mode} | {n} | {ref.bbox} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    print(f"\n# {args.width}x{args.height} RGB uint8, median of {args.runs}; L = {L * 1e3:.2f} ms")
    print("| mode | pair | bbox | " + " | ".join(BACKENDS) + " |")
    print("|---|---|---|" + "---|" * len(BACKENDS))
    print("\n".join(rows))
    print(f"{'FAIL' if bad else 'OK'}: {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
