"""``imgdiff A B``: where two image files differ, as boxes; or ``imgdiff DIR_A DIR_B`` for matching files.

Thin: parse, validate the outputs' folders, read (:mod:`imgdiff.io`), diff (:func:`imgdiff.diff`),
print, write. Exit codes follow ``diff(1)``: 0 same, 1 different, 2 trouble (bad input, bad option,
unreadable file, size mismatch without ``--allow-size-mismatch``, an output that would overwrite an
input). Every trouble is one line on stderr, never a traceback (set ``IMGDIFF_DEBUG=1`` to see one
for unexpected errors), and no output file is ever half-written.

Inputs are never written: before any image is read, every output is checked against the inputs and
against the other outputs (:mod:`imgdiff.write`: a few ``stat`` calls, and none at all for the plain
``A B [--json]`` form, which writes nothing).

Start-up (a single pair is mostly start-up and PNG decoding): parsing imports neither NumPy nor
OpenCV (:mod:`imgdiff.options`), and the plain ``A B [--json]`` form not even argparse
(:func:`parse_args`); byte-identical files are answered "same" after a pixel-free
validation (:func:`imgdiff.io.identical_pair`); otherwise the diff modules are imported in a thread
while both images are inflated (:mod:`imgdiff.png`: no NumPy needed), only the band of rows that can
differ is unfiltered and diffed (:mod:`imgdiff.band_diff`) unless image outputs are asked for, and
``--mask-out`` gets the result and the mask from one detection pass.
"""

from __future__ import annotations

import json
import os
import sys
from collections import namedtuple
from types import SimpleNamespace

EPILOG = """\
examples:
  imgdiff before.png after.png                     human summary; exit 0 same, 1 different, 2 trouble
  imgdiff before.png after.png --json              one JSON object: bbox, regions, changed_pixels, size
  imgdiff a.png b.png --out boxes.png --mask-out mask.png
                                                   boxes drawn on B; changed pixels as a 0/255 PNG
  imgdiff a.jpg b.jpg --mode exact --threshold 4   every pixel whose channel delta exceeds 4
  imgdiff a.png b.png --ignore 0,0,199,39 --ignore 10,500,90,520
                                                   ignore inclusive boxes x0,y0,x1,y1 (repeat the flag)
  imgdiff shots/base shots/new --json              batch: files with the same relative name, one JSON
                                                   line per pair; summary on stderr
  imgdiff shots/base shots/new --backend numba     many pairs: pay Numba's start-up (~0.4 s) once for
                                                   faster kernels (auto uses NumPy in a fresh process)

safety:
  Inputs are never written. An output that is an input file (same path, symlink or hard link), two
  outputs naming one file, or in batch mode an output folder inside an input folder (or holding one)
  is refused with exit 2 before anything is read. Outputs are written atomically (a temporary file,
  fsync, rename): a new file gets the umask's mode (0644 under umask 022); an overwritten one keeps its mode.
  --threshold is in 0-255 units at any bit depth (a 16-bit delta d counts as d/257).
"""


def parse_box(text: str) -> tuple[int, int, int, int]:
    """``"x0,y0,x1,y1"`` (inclusive pixel box) -> tuple; argparse type."""
    import argparse

    parts = text.split(",")
    try:
        x0, y0, x1, y1 = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--ignore expects x0,y0,x1,y1 (four integers, inclusive box), got {text!r}"
        ) from None
    if min(x0, y0, x1, y1) < 0 or x0 > x1 or y0 > y1:
        raise argparse.ArgumentTypeError(
            f"--ignore box {text!r} needs 0 <= x0 <= x1 and 0 <= y0 <= y1 (inclusive corners)"
        )
    return x0, y0, x1, y1


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


MAX_THRESHOLD = 255.0
"""Largest ``--threshold``: thresholds are in 0-255 units for 8- and 16-bit images alike (a 16-bit delta
``d`` counts as ``d / 257``), so no delta can exceed 255 and a larger threshold would find nothing."""


def _threshold(text: str) -> float:
    """``--threshold``: a finite number in ``0..255``; argparse type."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if 0 <= value <= MAX_THRESHOLD:  # NaN fails both comparisons
        return value
    why = ""
    if MAX_THRESHOLD < value < float("inf"):
        why = "; 16-bit images use these units too (a 16-bit delta d counts as d/257): nothing differs more"
    raise argparse.ArgumentTypeError(
        f"expected a number from 0 to 255 (0-255 units at 8 and 16 bits), got {text!r}{why}"
    )


def build_parser():
    """The ``argparse`` parser of every option; it reports a bad option as one line and exits 2."""
    import argparse

    from imgdiff.options import BACKENDS, DEFAULT_MAX_PIXELS, MODES, SUPPORTED_FORMATS

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str):  # noqa: D401 - argparse API
            self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    p = _Parser(
        prog="imgdiff",
        description=(
            "Find where two images differ, as exact or noise-aware bounding boxes.\n"
            f"Reads {', '.join(SUPPORTED_FORMATS)} (8/16-bit, gray/RGB/RGBA/palette).\n"
            "Give two folders to compare every file with the same relative name."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("a", metavar="A", help="reference image (or folder)")
    p.add_argument("b", metavar="B", help="changed image (or folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object (batch: one line per pair)")
    p.add_argument("--out", metavar="PNG", help="write B with the boxes drawn on it (batch: a folder)")
    p.add_argument(
        "--mask-out", metavar="PNG", help="write the changed pixels as a 0/255 PNG (batch: a folder)"
    )
    p.add_argument("--threshold", type=_threshold, metavar="T", help="per-channel delta that counts (0-255)")
    p.add_argument(
        "--mode", choices=MODES, default="robust", help="robust (default, ignores JPEG noise) or exact"
    )
    p.add_argument(
        "--ignore", type=parse_box, action="append", default=[], metavar="x0,y0,x1,y1",
        help="inclusive box to ignore; repeat the flag for more boxes",
    )  # fmt: skip
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="kernel backend (default auto)")
    p.add_argument(
        "--allow-size-mismatch", action="store_true",
        help="diff the overlap of different-size images and report the rest as changed (default: exit 2)",
    )  # fmt: skip
    p.add_argument(
        "--max-pixels", type=_positive_int, default=DEFAULT_MAX_PIXELS, metavar="N",
        help=f"refuse images whose header declares more pixels (default {DEFAULT_MAX_PIXELS:,} = 2x 8K)",
    )  # fmt: skip
    return p


PLAIN_FLAGS = ("--json", "--allow-size-mismatch")
"""The flags :func:`parse_args` reads without argparse (the common single-pair forms)."""


def parse_args(argv: list[str] | None):
    """The options of ``argv`` (default ``sys.argv[1:]``), as :func:`build_parser` parses them.

    The plain form, two paths and only :data:`PLAIN_FLAGS`, is read directly: importing and building
    argparse costs ~5 ms of a ~100 ms single-pair run. Anything else (other options, ``--help``, a path
    that starts with ``-``, an error) goes through argparse, which also reports the errors."""
    argv = sys.argv[1:] if argv is None else list(argv)
    paths = [arg for arg in argv if not arg.startswith("-")]
    flags = set(argv) - set(paths)
    if len(paths) != 2 or not flags <= set(PLAIN_FLAGS):
        return build_parser().parse_args(argv)
    from imgdiff.options import DEFAULT_MAX_PIXELS

    return SimpleNamespace(
        a=paths[0], b=paths[1], json="--json" in flags, out=None, mask_out=None, threshold=None,
        mode="robust", ignore=[], backend="auto", allow_size_mismatch="--allow-size-mismatch" in flags,
        max_pixels=DEFAULT_MAX_PIXELS,
    )  # fmt: skip


class Trouble(Exception):
    """Anything that makes the exit code 2; the message is the one line printed."""


def _check_single_outputs(args) -> None:
    """Before anything is read: ``--out`` and ``--mask-out`` are PNG names, neither is an input file
    nor the other output, and their folders are writable. Raises Trouble."""
    outputs = {"--out": args.out, "--mask-out": args.mask_out}
    if args.out is None and args.mask_out is None:
        return
    for flag, path in outputs.items():
        if path is not None and not path.lower().endswith(".png"):
            raise Trouble(f"{flag} {path!r}: outputs are PNG files; give a name ending in .png")
    from imgdiff.io_errors import ImageIOError
    from imgdiff.write import check_outputs, check_writable

    try:
        check_outputs({"input A": args.a, "input B": args.b}, outputs)
        for path in outputs.values():
            if path is not None:
                check_writable(path)
    except ImageIOError as e:
        raise Trouble(str(e).replace("\n", " ")) from None


def _check_batch_folders(args) -> None:
    """Before the folders are walked: the output folders are neither input folders, nor inside one, nor
    holding one, nor overlapping each other, and can be created and written. Raises Trouble."""
    outputs = {"--out": args.out, "--mask-out": args.mask_out}
    if args.out is None and args.mask_out is None:
        return
    from imgdiff.io_errors import ImageIOError
    from imgdiff.write import check_folder_writable, check_output_folders

    try:
        check_output_folders({"input folder A": args.a, "input folder B": args.b}, outputs)
        for flag, folder in outputs.items():
            if folder is not None:
                check_folder_writable(folder, flag)
    except ImageIOError as e:
        raise Trouble(str(e).replace("\n", " ")) from None


def _check_batch_targets(args, matches: list[Match]) -> None:
    """Before any image is read: no output file is an input file (links inside the folders) or written
    for two pairs. Raises Trouble."""
    outputs = {"--out": args.out, "--mask-out": args.mask_out}
    if args.out is None and args.mask_out is None:
        return
    from imgdiff.io_errors import ImageIOError
    from imgdiff.write import check_targets

    inputs = [os.path.join(args.a, m.name) for m in matches if m.in_a]
    inputs += [os.path.join(args.b, m.name) for m in matches if m.in_b]
    targets = [
        (flag, m.name, _png_name(folder, m.name))
        for m in matches
        if m.in_a and m.in_b
        for flag, folder in outputs.items()
        if folder is not None
    ]
    try:
        check_targets(inputs, targets)
    except ImageIOError as e:
        raise Trouble(str(e).replace("\n", " ")) from None


def _diff_options(args) -> dict:
    return {
        "mode": args.mode,
        "threshold": args.threshold,
        "ignore": args.ignore,
        "backend": args.backend,
        "allow_size_mismatch": args.allow_size_mismatch,
    }


def _encode_outputs(b, result, mask, out: str | None, mask_out: str | None) -> list[tuple[str, bytes]]:
    """Encode every requested output in memory first, so a failure writes nothing."""
    from imgdiff.write import encode_mask_png, encode_png, render_overlay

    files = []
    if out is not None:
        boxes = [r.bbox for r in result.regions] or ([result.bbox] if result.bbox is not None else [])
        files.append((out, encode_png(render_overlay(b, boxes))))
    if mask_out is not None:
        files.append((mask_out, encode_mask_png(mask)))
    return files


def _diff_pair(args, path_a: str, path_b: str, out: str | None, mask_out: str | None, pair=None):
    """Read (unless ``pair`` is given), diff, write outputs; returns the Result. Raises Trouble.

    With ``mask_out`` the detection runs once and yields both the result and the mask. The diff
    modules are imported only after the decoders started: a single pair's import thread
    (:func:`run_single`) loads them meanwhile, and importing them here first would wait for it."""
    from imgdiff.io import ImageIOError, read_pair

    try:
        a, b = pair if pair is not None else read_pair(path_a, path_b, max_pixels=args.max_pixels)
        from imgdiff.api import diff, diff_and_mask
        from imgdiff.write import atomic_write_all

        if mask_out is not None:
            result, mask = diff_and_mask(a, b, **_diff_options(args))  # mask: (H, W) bool
        else:
            result, mask = diff(a, b, **_diff_options(args)), None
        atomic_write_all(_encode_outputs(b, result, mask, out, mask_out))  # all or nothing
    except (ImageIOError, ValueError) as e:  # SizeMismatchError is a ValueError
        raise Trouble(str(e).replace("\n", " ")) from None
    return result


def _human(result, label: str) -> str:
    if result.same:
        return f"same: {label} ({result.width}x{result.height})"
    n = len(result.regions)
    return (
        f"different: {label}: bbox {list(result.bbox)}, {n} region{'s' * (n != 1)}, "
        f"{result.changed_pixels} changed pixels ({result.width}x{result.height})"
    )


def _same_files(args):
    """The Result for byte-identical valid files (no decode of the pixels, no NumPy), else None."""
    from imgdiff.io import ImageIOError, identical_pair

    try:
        info = identical_pair(args.a, args.b, max_pixels=args.max_pixels)
    except ImageIOError as e:
        raise Trouble(str(e).replace("\n", " ")) from None
    if info is None:
        return None
    from imgdiff.result import Result  # only now: it imports dataclasses (~8 ms before NumPy's import)

    return Result(bbox=None, width=info.width, height=info.height)


def _import_kernels() -> None:
    """Import what the diff needs after the inflate (NumPy, the diff modules, and the band unfilter:
    the native kernel, else ``imagecodecs.delta_decode``, ~4 ms to load); run in a thread while the
    images inflate."""
    try:
        from imgdiff import png_spng

        if png_spng.native_unfilter() is None:
            from imagecodecs import delta_decode  # noqa: F401

        import imgdiff.api  # noqa: F401
        import imgdiff.band_diff  # noqa: F401
    except Exception:  # noqa: BLE001 - the main thread imports it again and reports the error
        pass


def _prefetch_opencv(elements: int) -> None:
    """Start importing OpenCV in a thread when a diff of about ``elements`` array elements will use it
    (:mod:`imgdiff.morph`: large arrays), so that the import overlaps the unfilter (GIL released)."""
    import threading

    from imgdiff import morph

    if elements >= morph.SMALL and "cv2" not in sys.modules:
        threading.Thread(target=morph.cv2, daemon=True).start()


def _diff_rows(args, on_inflate=lambda: None):
    """The default single-pair path (no image outputs): decode only the band of rows that can differ
    (:func:`imgdiff.pair_rows.read_pair_rows`) and diff it (:func:`imgdiff.band_diff.diff_band`); whole images
    when the files are not two PNGs of one layout. ``on_inflate()``: called once when the inflate
    starts (:func:`run_single` starts its import thread there)."""
    from imgdiff.io import ImageIOError, probe
    from imgdiff.pair_rows import read_pair_rows

    try:

        def band(h: int, r0: int, r1: int) -> tuple[int, int]:
            from imgdiff.band_diff import band_rows  # not before the inflate: it imports dataclasses (~9 ms)

            rows = band_rows(h, r0, r1, mode=args.mode)
            _prefetch_opencv((r1 - r0 + 1) * probe(args.a).width * 4)  # rows that may differ
            return rows

        def window(w: int, c0: int, c1: int) -> tuple[int, int]:
            from imgdiff.band_diff import band_rows

            return band_rows(w, c0, c1, mode=args.mode)  # the columns: the same context as the rows

        got = read_pair_rows(
            args.a, args.b, max_pixels=args.max_pixels, band=band, window=window, on_inflate=on_inflate
        )
        opts = _diff_options(args)
        if got.y0 == 0 and len(got.a) == got.height and got.x0 == 0 and got.a.shape[1] == got.width:
            from imgdiff.api import diff  # whole images (other formats or layouts): the plain diff

            return diff(got.a, got.b, **opts)
        del opts["allow_size_mismatch"]  # a band means two PNGs of one layout
        from imgdiff.band_diff import diff_band

        return diff_band(got.a, got.b, y0=got.y0, height=got.height, x0=got.x0, width=got.width, **opts)
    except (ImageIOError, ValueError) as e:  # SizeMismatchError is a ValueError
        raise Trouble(str(e).replace("\n", " ")) from None


def run_single(args) -> int:
    import threading

    _check_single_outputs(args)
    result = None
    plain = args.out is None and args.mask_out is None
    if plain:
        result = _same_files(args)
    if result is None:
        importer = threading.Thread(target=_import_kernels)  # imports overlap the inflate (no GIL held)
        if plain:
            result = _diff_rows(args, on_inflate=importer.start)  # started once the inflate starts
        else:
            importer.start()
            result = _diff_pair(args, args.a, args.b, args.out, args.mask_out)
        if importer.ident is not None:
            importer.join()
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(_human(result, f"{args.a} vs {args.b}"))
    return 0 if result.same else 1


# ----------------------------------------------------------------------------------------------- batch


class Match(namedtuple("Match", "name in_a in_b")):
    """One relative file name seen in folder A and/or folder B: ``name`` (path relative to the folder,
    with ``/`` separators), ``in_a`` / ``in_b`` (present in A / in B). A named tuple: ``dataclasses``
    would add ~7 ms to every CLI start."""

    __slots__ = ()


def _files(root: str) -> set[str]:
    names = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in files:
            if not f.startswith("."):
                names.add(os.path.relpath(os.path.join(folder, f), root).replace(os.sep, "/"))
    return names


def match_folders(dir_a: str, dir_b: str) -> list[Match]:
    """Every non-hidden file under either folder, by relative name, sorted."""
    fa, fb = _files(dir_a), _files(dir_b)
    return [Match(n, n in fa, n in fb) for n in sorted(fa | fb)]


def _png_name(folder: str | None, name: str) -> str | None:
    if folder is None:
        return None
    return os.path.join(folder, os.path.splitext(name)[0] + ".png")


def run_batch(args) -> int:
    """Diff every pair of same-named files; decoding the next pair overlaps diffing this one."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    gc.enable()  # many pairs: collect as usual (:func:`_main` turns it off for a fresh process)

    from imgdiff.io import ImageIOError, read_pair
    from imgdiff.write import make_folders

    _check_batch_folders(args)
    matches = match_folders(args.a, args.b)
    _check_batch_targets(args, matches)
    pairs = [m for m in matches if m.in_a and m.in_b]
    counts = {"same": 0, "different": 0, "error": 0, "missing": 0}

    def emit(name: str, status: str, result=None, error: str | None = None) -> None:
        counts[status] += 1
        if args.json:
            row = {"name": name, "status": status}
            row.update(result.to_json() if result is not None else {"error": error})
            print(json.dumps(row), flush=True)
        elif result is not None:
            print(_human(result, name), flush=True)
        else:
            print(f"{status}: {name}: {error}", flush=True)

    for m in matches:
        if not (m.in_a and m.in_b):
            side, other = ("A", "B") if m.in_a else ("B", "A")
            emit(m.name, "missing", error=f"only in {side}; no file of that name in {other}")

    def load(m: Match):
        try:
            return read_pair(
                os.path.join(args.a, m.name), os.path.join(args.b, m.name), max_pixels=args.max_pixels
            )
        except Exception as e:  # noqa: BLE001 - handed to the main thread, which classifies it
            return e

    with ThreadPoolExecutor(max_workers=1) as pool:
        upcoming = pool.submit(load, pairs[0]) if pairs else None
        for i, m in enumerate(pairs):
            loaded = upcoming.result()
            upcoming = pool.submit(load, pairs[i + 1]) if i + 1 < len(pairs) else None
            out, mask_out = _png_name(args.out, m.name), _png_name(args.mask_out, m.name)
            try:
                if isinstance(loaded, Exception):
                    raise loaded
                for target in (out, mask_out):
                    if target is not None:
                        make_folders(os.path.dirname(target))
                result = _diff_pair(args, "", "", out, mask_out, pair=loaded)
            except (Trouble, ImageIOError, ValueError, OSError) as e:
                emit(m.name, "error", error=str(e).replace("\n", " "))
            else:
                emit(m.name, "different" if not result.same else "same", result)
    summary = f"{len(pairs)} pairs: " + ", ".join(f"{v} {k}" for k, v in counts.items())
    print(summary, file=sys.stderr if args.json else sys.stdout)
    if counts["error"] or counts["missing"]:
        return 2
    return 1 if counts["different"] else 0


def run(args) -> int:
    a_dir, b_dir = os.path.isdir(args.a), os.path.isdir(args.b)
    if a_dir and b_dir:
        return run_batch(args)
    if a_dir != b_dir and os.path.exists(args.a) and os.path.exists(args.b):
        raise Trouble(
            f"A {args.a!r} is a {'folder' if a_dir else 'file'} but B {args.b!r} is a "
            f"{'folder' if b_dir else 'file'}; give two files or two folders"
        )
    return run_single(args)


def main(argv: list[str] | None = None) -> int:
    """The console script. Called without ``argv`` (a real process), it exits right after flushing
    stdout/stderr (``os._exit``): every output file is already written (atomically), and skipping
    the interpreter's teardown of NumPy/OpenCV and the decoded images saves ~50-100 ms of a 4K pair."""
    rc = _main(argv)
    if argv is None and os.environ.get("IMGDIFF_DEBUG") is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _keep_freed_memory() -> None:
    """Ask glibc's malloc to serve large blocks from its heap and keep freed memory (``mallopt``
    ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` = 1 GiB) for this short-lived process: the diff's
    many multi-MB NumPy temporaries then reuse pages instead of each mapping and faulting in fresh
    ones (a 4K all-pixels-differ pair: ~4,000 fewer page faults, ~8 ms CPU). No-op off glibc."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return
    mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD


def _main(argv: list[str] | None) -> int:
    if "numpy" not in sys.modules:  # a fresh CLI process: imgdiff uses no BLAS, skip its thread pool
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        _keep_freed_memory()
        import gc

        gc.disable()  # a single pair is one short pass (the imports alone trigger ~5 ms of collections)
    try:
        args = parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad option (2, already printed as one line)
        return int(e.code or 0)
    try:
        return run(args)
    except Trouble as e:
        print(f"imgdiff: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI promises one line, never a traceback
        if os.environ.get("IMGDIFF_DEBUG"):
            raise
        from imgdiff.io_errors import ImageIOError

        prefix = "" if isinstance(e, (ImageIOError, ValueError)) else f"unexpected {type(e).__name__}: "
        print(f"imgdiff: error: {prefix}{e}".replace("\n", " "), file=sys.stderr)
    return 2
