"""imgdiff speed against the memory floor, OpenCV, odiff and blazediff, in one run (issue 2, Performance).

Pairs (3840x2160 RGB by default) come from `tests/imgdiff/cases.py` (seeded): ``identical``,
``small_patch`` (a few pixels changed) and ``jpeg_q90`` (B is A after a JPEG q90 round trip: almost
every pixel differs). Every figure is the median of ``--runs`` timed runs after one warm-up run.

Rows:
- ``L``: ``np.array_equal(a, b)`` on the decoded arrays, one read of both images: the physical floor.
- ``kernel <mode>/<backend>``: :func:`imgdiff.diff` on the decoded arrays.
- ``opencv exact box``: ``cv2.absdiff`` + ``cv2.threshold`` + ``cv2.findNonZero`` + ``cv2.boundingRect``
  on the ``(H, W*3)`` view (per-channel delta > 0, same answer as ``--mode exact``).
- ``cli ...``: end-to-end ``python -m imgdiff A.png B.png --json`` in a subprocess (warm page cache,
  imgdiff's bytecode compiled first as an install would: :func:`compile_bytecode`), wall and CPU
  (user+sys) time, next to ``odiff A.png B.png`` and blazediff's Python ``compare``.

odiff: set ``IMGDIFF_BENCH_ODIFF=/path/to/odiff`` or put ``odiff`` on PATH (``npm install --prefix
/tmp/odiff odiff-bin`` ships it as ``/tmp/odiff/node_modules/@odiff/linux-x64/odiff``); skipped when
absent. blazediff: ``pip install 'notelens[bench]'``; skipped when absent.

Usage: ``python benchmarks/imgdiff_bench.py [--width 3840 --height 2160 --runs 5 --backends numpy,numba]``
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import cv2
import numpy as np

from imgdiff import diff
from imgdiff.io import read_pair

# The seeded cases and the photo corpus are test data (tests/imgdiff/), not part of the wheel.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.imgdiff.cases import make_case  # noqa: E402

CASES = ("identical", "small_patch", "jpeg_q90")


@dataclass
class Row:
    """One measured line of the table: seconds per case."""

    name: str
    """What was timed."""
    kind: str
    """``array`` (on decoded arrays, compared to L) or ``cli`` (end to end, compared to odiff)."""
    wall: dict[str, float]
    """Median wall seconds per case."""
    cpu: dict[str, float]
    """Median CPU (user+sys) seconds per case; only for ``cli`` rows."""


def median_time(fn: Callable[[], object], runs: int) -> float:
    """Median wall seconds of ``runs`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_subprocess(cmd: list[str], runs: int, ok_codes: tuple[int, ...]) -> tuple[float, float]:
    """Median (wall, cpu) seconds of running ``cmd`` ``runs`` times after one warm-up run."""
    walls, cpus = [], []
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode not in ok_codes:
            err = proc.stderr.decode(errors="replace").strip()
            raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {err}")
        if i:
            walls.append(wall)
            cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return statistics.median(walls), statistics.median(cpus)


def opencv_exact_box(a: np.ndarray, b: np.ndarray) -> tuple[int, int, int, int] | None:
    """The OpenCV recipe: absdiff, threshold (> 0), findNonZero, boundingRect; inclusive box."""
    h, w, c = a.shape
    d = cv2.absdiff(a.reshape(h, w * c), b.reshape(h, w * c))  # (H, W*C)
    _, m = cv2.threshold(d, 0, 255, cv2.THRESH_BINARY)
    pts = cv2.findNonZero(m)
    if pts is None:
        return None
    x, y, bw, bh = cv2.boundingRect(pts)
    return x // c, y, (x + bw - 1) // c, y + bh - 1


def compile_bytecode() -> None:
    """Write imgdiff's ``.pyc`` files, as ``pip install`` does (and any run does unless
    ``PYTHONDONTWRITEBYTECODE`` is set, as it is on the dev VM): otherwise every CLI run would
    compile the package's source first (~20 ms), which no installed copy pays."""
    import compileall

    import imgdiff

    compileall.compile_dir(os.path.dirname(imgdiff.__file__), quiet=2)


def find_odiff() -> str | None:
    path = os.environ.get("IMGDIFF_BENCH_ODIFF") or shutil.which("odiff")
    return path if path and os.access(path, os.X_OK) else None


def has_blazediff() -> bool:
    try:
        import blazediff  # noqa: F401
    except ImportError:
        return False
    return True


def write_pairs(folder: str, width: int, height: int) -> dict[str, tuple[str, str, float]]:
    """PNG pairs per case -> (path A, path B, fraction of pixels that differ)."""
    out = {}
    for name in CASES:
        case = make_case(name, h=height, w=width)
        pa, pb = os.path.join(folder, f"{name}_a.png"), os.path.join(folder, f"{name}_b.png")
        cv2.imwrite(pa, case.a)
        cv2.imwrite(pb, case.b)
        frac = float((case.a != case.b).any(axis=2).mean())
        out[name] = (pa, pb, frac)
    return out


def measure(
    pairs: dict[str, tuple[str, str, float]], *, runs: int, backends: list[str], cli: bool
) -> tuple[list[Row], list[str]]:
    """Every row of the table (cases in :data:`CASES` order) and a line per skipped row."""
    decoded = {name: read_pair(pa, pb) for name, (pa, pb, _) in pairs.items()}
    rows: list[Row] = []
    skipped: list[str] = []

    def array_row(name: str, fn: Callable[[np.ndarray, np.ndarray], object]) -> None:
        wall = {c: median_time(lambda c=c: fn(*decoded[c]), runs) for c in CASES}
        rows.append(Row(name, "array", wall, {}))

    array_row("L = np.array_equal", np.array_equal)
    for mode in ("exact", "robust"):
        for backend in backends:
            try:
                diff(*decoded[CASES[0]], mode=mode, backend=backend)
            except (ImportError, RuntimeError) as e:  # backend not built / no GPU: say so, go on
                skipped.append(f"kernel {mode}/{backend}: unavailable ({type(e).__name__}: {e})")
                continue
            array_row(f"kernel {mode}/{backend}", partial(diff, mode=mode, backend=backend))
    array_row("opencv absdiff+threshold+boundingRect", opencv_exact_box)
    if not cli:
        return rows, skipped
    compile_bytecode()
    imgdiff_cmd = [sys.executable, "-m", "imgdiff"]
    tools: list[tuple[str, Callable[[str, str], list[str]], tuple[int, ...]]] = [
        ("cli imgdiff (python -m imgdiff --json)", lambda a, b: [*imgdiff_cmd, a, b, "--json"], (0, 1)),
    ]
    odiff = find_odiff()
    if odiff:
        tools.append(("cli odiff", lambda a, b: [odiff, a, b], (0, 22)))
    if has_blazediff():
        code = "import sys, blazediff; blazediff.compare(sys.argv[1], sys.argv[2])"
        tools.append(
            ("cli blazediff (python compare)", lambda a, b: [sys.executable, "-c", code, a, b], (0,))
        )
    for label, make_cmd, ok in tools:
        wall, cpu = {}, {}
        for c in CASES:
            pa, pb, _ = pairs[c]
            wall[c], cpu[c] = median_subprocess(make_cmd(pa, pb), runs, ok)
        rows.append(Row(label, "cli", wall, cpu))
    if odiff is None:
        skipped.append("cli odiff: not found (set IMGDIFF_BENCH_ODIFF or put odiff on PATH)")
    if not has_blazediff():
        skipped.append("cli blazediff: not installed (pip install 'notelens[bench]')")
    return rows, skipped


def format_table(rows: list[Row], fractions: dict[str, float], title: str) -> str:
    """One text table: ms and ratio vs L (array rows) or vs odiff (cli rows) per case."""
    floor = next(r for r in rows if r.name.startswith("L ")).wall
    odiff = next((r for r in rows if r.name == "cli odiff"), None)
    head = f"{'':42s}" + "".join(f"{c + f' ({fractions[c]:.3%} px differ)':>34s}" for c in CASES)
    lines = [title, head]
    for r in rows:
        cells = []
        for c in CASES:
            t = r.wall[c]
            if r.kind == "array":
                cells.append(f"{t * 1e3:9.1f} ms {t / floor[c]:6.2f}xL")
            else:
                vs = f"{t / odiff.wall[c]:5.2f}x odiff" if odiff else "   (no odiff)"
                cells.append(f"{t * 1e3:6.0f} ms cpu {r.cpu[c] * 1e3:5.0f} {vs}")
        lines.append(f"{r.name:42s}" + "".join(f"{cell:>34s}" for cell in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=3840, help="image width (default 3840)")
    p.add_argument("--height", type=int, default=2160, help="image height (default 2160)")
    p.add_argument("--runs", type=int, default=5, help="timed runs per figure; the median is shown")
    p.add_argument("--backends", default="numpy,numba", help="comma-separated kernel backends")
    p.add_argument("--no-cli", action="store_true", help="skip the end-to-end subprocess rows")
    args = p.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    with tempfile.TemporaryDirectory(prefix="imgdiff-bench-") as folder:
        pairs = write_pairs(folder, args.width, args.height)
        rows, skipped = measure(pairs, runs=args.runs, backends=backends, cli=not args.no_cli)
    fractions = {c: pairs[c][2] for c in CASES}
    title = (
        f"imgdiff bench: {args.width}x{args.height} RGB, median of {args.runs} runs, {os.cpu_count()} CPUs"
    )
    print(format_table(rows, fractions, title))
    for line in skipped:
        print("skipped:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
