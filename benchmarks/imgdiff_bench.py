"""imgdiff speed against the memory floor, OpenCV, odiff and blazediff, in one run.

Pairs (3840x2160 by default), each written as PNG to a temporary folder:

- OpenCV-written (every row filtered with Sub, zlib level 1), from `tests/imgdiff/cases.py` (seeded):
  ``identical``, ``small_patch`` (a few pixels changed) and ``jpeg_q90`` (B is A after a JPEG q90
  round trip: almost every pixel differs).
- Pillow-written real photos (``PIL.Image.save`` defaults: libpng-style adaptive filters, nearly
  every row Paeth on a photo, zlib level 6) from `tests/imgdiff/photos.py`, upscaled to the size:
  ``identical``, ``small_patch`` (a 24x24 patch brightened by 40 levels) and ``jpeg_q90``.
- Browser-style: the same photos as RGBA with opaque alpha (what a canvas or screenshot export
  holds), written by Pillow with ``compress_level=6`` (browsers' libpng: adaptive filters, zlib
  level 6): ``small_patch`` and ``jpeg_q90``.

Rows:
- ``L``: ``np.array_equal(a, b)`` on the decoded arrays, one read of both images: the physical floor.
- ``kernel <mode>/<backend>``: :func:`imgdiff.diff` on the decoded arrays (OpenCV-written pairs).
- ``opencv exact box``: ``cv2.absdiff`` + ``cv2.threshold`` + ``cv2.findNonZero`` + ``cv2.boundingRect``
  on the ``(H, W*3)`` view (per-channel delta > 0, same answer as ``--mode exact``).
- CLI table, one line per pair: end-to-end ``python -m imgdiff A.png B.png --json`` in a subprocess
  (warm page cache, imgdiff's bytecode compiled first as an install would: :func:`compile_bytecode`),
  next to ``odiff A.png B.png --parsable-stdout`` and blazediff's Python ``compare``: wall and CPU
  (user+sys) time, medians of alternating runs (one run of each tool in turn), and imgdiff's ratios
  to odiff. The load average is printed with it: the CPU time is the robust figure on a shared machine.

odiff: set ``IMGDIFF_BENCH_ODIFF=/path/to/odiff`` or put ``odiff`` on PATH (``npm install --prefix
~/.cache/odiff odiff-bin`` ships it as ``~/.cache/odiff/node_modules/@odiff/linux-x64/odiff``); skipped
when absent. blazediff: ``pip install 'notelens[bench]'``; skipped when absent.

Usage: ``python benchmarks/imgdiff_bench.py [--width 3840 --height 2160 --runs 5 --backends numpy,numba
--photos astronaut,coffee,chelsea]``
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
PHOTOS = ("astronaut", "coffee", "chelsea")
"""Default photos of `tests/imgdiff/photos.py` for the Pillow-written and browser-style pairs."""
PATCH = 24
"""Side of the patch planted in the photos' ``small_patch`` pairs (pixels)."""


@dataclass
class Pair:
    """Two PNG files to diff with each CLI."""

    name: str
    """``<writer> <image> <case>``, e.g. ``pillow coffee jpeg_q90``."""
    a: str
    """Path of image A."""
    b: str
    """Path of image B."""
    differ: float
    """Fraction of pixels that differ."""


@dataclass
class Row:
    """One measured line of the table: seconds per case."""

    name: str
    """What was timed."""
    wall: dict[str, float]
    """Median wall seconds per case."""


@dataclass
class CliRow:
    """One line of the CLI table: median (wall, cpu) seconds per tool on one pair."""

    pair: Pair
    """The files diffed."""
    times: dict[str, tuple[float, float]]
    """Tool label -> median (wall, CPU user+sys) seconds."""


def median_time(fn: Callable[[], object], runs: int) -> float:
    """Median wall seconds of ``runs`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_timed(cmd: list[str], ok_codes: tuple[int, ...]) -> tuple[float, float]:
    """(wall, cpu) seconds of one run of ``cmd``; raises when it exits with a code not in ``ok_codes``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok_codes:
        err = proc.stderr.decode(errors="replace").strip()
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {err}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median_alternating(tools: list[Tool], pair: Pair, runs: int) -> dict[str, tuple[float, float]]:
    """Median (wall, cpu) per tool over ``runs`` rounds after a warm-up round; each round runs every
    tool once, in turn, so that load changes on a shared machine hit all tools alike."""
    seen: dict[str, list[tuple[float, float]]] = {t.label: [] for t in tools}
    for i in range(runs + 1):
        for t in tools:
            got = run_timed(t.command(pair.a, pair.b), t.ok_codes)
            if i:
                seen[t.label].append(got)
    med = statistics.median
    return {label: (med(w for w, _ in v), med(c for _, c in v)) for label, v in seen.items()}


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
    ``PYTHONDONTWRITEBYTECODE`` is set, as some environments do): otherwise every CLI run would
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


@dataclass
class Tool:
    """A CLI to time."""

    label: str
    """Name in the table."""
    command: Callable[[str, str], list[str]]
    """``(path A, path B) -> argv``."""
    ok_codes: tuple[int, ...]
    """Exit codes of a successful run."""


def write_pairs(folder: str, width: int, height: int) -> dict[str, tuple[str, str, float]]:
    """OpenCV-written PNG pairs per case -> (path A, path B, fraction of pixels that differ)."""
    out = {}
    for name in CASES:
        case = make_case(name, h=height, w=width)
        pa, pb = os.path.join(folder, f"{name}_a.png"), os.path.join(folder, f"{name}_b.png")
        cv2.imwrite(pa, case.a)
        cv2.imwrite(pb, case.b)
        frac = float((case.a != case.b).any(axis=2).mean())
        out[name] = (pa, pb, frac)
    return out


def _jpeg_q90(rgb: np.ndarray) -> np.ndarray:
    """``rgb`` (H, W, 3|4) after a JPEG q90 round trip of its colour channels (alpha kept)."""
    ok, enc = cv2.imencode(".jpg", np.ascontiguousarray(rgb[:, :, 2::-1]), [cv2.IMWRITE_JPEG_QUALITY, 90])
    out = rgb.copy()
    out[:, :, :3] = cv2.imdecode(enc, cv2.IMREAD_COLOR)[:, :, ::-1]
    return out


def write_photo_pairs(folder: str, width: int, height: int, photos: list[str]) -> list[Pair]:
    """Pillow-written (default settings) and browser-style (RGBA, ``compress_level=6``) pairs of the
    real photos, upscaled to ``height`` x ``width``."""
    from PIL import Image

    from tests.imgdiff.photos import photo_4k

    pairs = []
    for name in photos:
        rgb = photo_4k(name, h=height, w=width)  # (H, W, 3) uint8
        rgba = np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)])  # (H, W, 4): opaque alpha
        for writer, a, save, cases in (
            ("pillow", rgb, {}, CASES),
            ("browser", rgba, {"compress_level": 6}, CASES[1:]),
        ):
            patched = a.copy()
            y, x, side = height * 9 // 20, width * 3 // 5, min(PATCH, height, width)
            patched[y : y + side, x : x + side, :3] = np.clip(
                patched[y : y + side, x : x + side, :3].astype(np.int16) + 40, 0, 255
            )
            for case in cases:
                b = {"identical": a, "small_patch": patched, "jpeg_q90": None}[case]
                b = _jpeg_q90(a) if b is None else b
                pa = os.path.join(folder, f"{writer}_{name}_{case}_a.png")
                pb = os.path.join(folder, f"{writer}_{name}_{case}_b.png")
                Image.fromarray(a).save(pa, **save)
                Image.fromarray(b).save(pb, **save)
                differ = float((a != b).any(axis=2).mean())
                pairs.append(Pair(f"{writer} {name} {case}", pa, pb, differ))
    return pairs


def cli_tools() -> tuple[list[Tool], list[str]]:
    """The CLIs to time (imgdiff first) and a line per missing one."""
    imgdiff_cmd = [sys.executable, "-m", "imgdiff"]
    tools = [Tool("imgdiff", lambda a, b: [*imgdiff_cmd, a, b, "--json"], (0, 1))]
    skipped = []
    odiff = find_odiff()
    if odiff:
        tools.append(Tool("odiff", lambda a, b: [odiff, a, b, "--parsable-stdout"], (0, 21, 22)))
    else:
        skipped.append("cli odiff: not found (set IMGDIFF_BENCH_ODIFF or put odiff on PATH)")
    if has_blazediff():
        code = "import sys, blazediff; blazediff.compare(sys.argv[1], sys.argv[2])"
        tools.append(Tool("blazediff", lambda a, b: [sys.executable, "-c", code, a, b], (0,)))
    else:
        skipped.append("cli blazediff: not installed (pip install 'notelens[bench]')")
    return tools, skipped


def measure_cli(pairs: list[Pair], *, runs: int) -> tuple[list[CliRow], list[str]]:
    """One :class:`CliRow` per pair and a line per skipped tool."""
    compile_bytecode()
    tools, skipped = cli_tools()
    return [CliRow(pair, median_alternating(tools, pair, runs)) for pair in pairs], skipped


def measure(
    pairs: dict[str, tuple[str, str, float]], *, runs: int, backends: list[str]
) -> tuple[list[Row], list[str]]:
    """The rows on decoded arrays of the OpenCV-written pairs (cases in :data:`CASES` order) and a
    line per skipped row."""
    decoded = {name: read_pair(pa, pb) for name, (pa, pb, _) in pairs.items()}
    rows: list[Row] = []
    skipped: list[str] = []

    def array_row(name: str, fn: Callable[[np.ndarray, np.ndarray], object]) -> None:
        wall = {c: median_time(lambda c=c: fn(*decoded[c]), runs) for c in CASES}
        rows.append(Row(name, wall))

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
    return rows, skipped


def format_table(rows: list[Row], fractions: dict[str, float], title: str) -> str:
    """The rows on decoded arrays: ms and ratio to L per case."""
    floor = next(r for r in rows if r.name.startswith("L ")).wall
    head = f"{'':42s}" + "".join(f"{c + f' ({fractions[c]:.3%} px differ)':>34s}" for c in CASES)
    lines = [title, head]
    for r in rows:
        cells = [f"{r.wall[c] * 1e3:9.1f} ms {r.wall[c] / floor[c]:6.2f}xL" for c in CASES]
        lines.append(f"{r.name:42s}" + "".join(f"{cell:>34s}" for cell in cells))
    return "\n".join(lines)


def format_cli_table(rows: list[CliRow], title: str) -> str:
    """One line per pair: each tool's median wall and CPU ms, then imgdiff / odiff for both (a ratio
    below 1 is imgdiff faster); a last line with the median ratios per writer."""
    tools = list(rows[0].times) if rows else []
    head = f"{'pair':34s}{'differ':>8s}" + "".join(f"{t + ' wall/cpu ms':>24s}" for t in tools)
    has_odiff = "odiff" in tools
    if has_odiff:
        head += f"{'imgdiff/odiff wall':>20s}{'cpu':>7s}"
    lines = [title, head]
    ratios: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        line = f"{r.pair.name:34s}{r.pair.differ:8.2%}"
        line += "".join(f"{r.times[t][0] * 1e3:14.0f} /{r.times[t][1] * 1e3:6.0f}  " for t in tools)
        if has_odiff:
            (wi, ci), (wo, co) = r.times["imgdiff"], r.times["odiff"]
            line += f"{wi / wo:18.2f}x{ci / co:6.2f}x"
            ratios.setdefault(r.pair.name.split()[0], []).append((wi / wo, ci / co))
        lines.append(line)
    for writer, got in ratios.items():
        wall, cpu = statistics.median(w for w, _ in got), statistics.median(c for _, c in got)
        lines.append(f"median imgdiff/odiff, {writer} pairs: wall {wall:.2f}x, cpu {cpu:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=3840, help="image width (default 3840)")
    p.add_argument("--height", type=int, default=2160, help="image height (default 2160)")
    p.add_argument("--runs", type=int, default=5, help="timed runs per figure; the median is shown")
    p.add_argument("--backends", default="numpy,numba", help="comma-separated kernel backends")
    p.add_argument(
        "--photos", default=",".join(PHOTOS), help="comma-separated photos for the Pillow and browser pairs"
    )
    p.add_argument("--no-cli", action="store_true", help="skip the end-to-end subprocess rows")
    args = p.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    photos = [name for name in args.photos.split(",") if name]
    with tempfile.TemporaryDirectory(prefix="imgdiff-bench-") as folder:
        pairs = write_pairs(folder, args.width, args.height)
        rows, skipped = measure(pairs, runs=args.runs, backends=backends)
        fractions = {c: pairs[c][2] for c in CASES}
        size = f"{args.width}x{args.height}"
        title = f"imgdiff bench: {size}, median of {args.runs} runs, {os.cpu_count()} CPUs"
        print(format_table(rows, fractions, title + "; OpenCV-written RGB pairs, decoded arrays"))
        if not args.no_cli:
            cli_pairs = [Pair(f"opencv {c}", pa, pb, differ) for c, (pa, pb, differ) in pairs.items()]
            cli_pairs += write_photo_pairs(folder, args.width, args.height, photos)
            load = os.getloadavg()[0]
            cli_rows, cli_skipped = measure_cli(cli_pairs, runs=args.runs)
            skipped += cli_skipped
            title = (
                f"\ncli: median of {args.runs} alternating runs; load average {load:.1f} before, "
                f"{os.getloadavg()[0]:.1f} after"
            )
            print(format_cli_table(cli_rows, title))
    for line in skipped:
        print("skipped:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
