"""PNG decoders and unfilter alternatives on a Pillow-written 4K photo (adaptive filters: Paeth rows).

CPU seconds per image (best of ``--runs``, in this process unless said otherwise), for the table in
benchmarks/README.md:

- full decoders on the file: imagecodecs' libpng / libspng / APNG, OpenCV, Pillow, and
  :func:`imgdiff.png.decode` (ISA-L inflate + unfilter);
- the inflate alone (ISA-L, :func:`imgdiff.png_pair_inflate.inflate_one`);
- unfilters of the inflated rows: the native kernel (:mod:`imgdiff.png_spng`, x86-64 Linux; whole
  image and per filter type), libspng through ctypes, the same wrapper through imagecodecs' public
  ``png_decode``, libspng per filter type (every row set to it);
- a Numba kernel (scalar Paeth): start-up (``import numba`` + the first call from its cache) and the
  kernel, in fresh subprocesses after one run that fills the cache.

Usage: ``python benchmarks/png_decoders.py [--width 3840 --height 2160 --runs 3 --photo astronaut]``
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time

import cv2
import imagecodecs
import numpy as np
from PIL import Image

from imgdiff import png, png_pair_inflate, png_spng

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.imgdiff.photos import photo_4k  # noqa: E402

NUMBA_KERNEL = '''
import numba, numpy as np

@numba.njit(cache=True, nogil=True)
def unfilter_paeth(raw, out, bpp):
    """Every row Paeth: ``raw`` (H, 1 + n) filtered rows, ``out`` (H, n)."""
    h, n = out.shape
    for y in range(h):
        for i in range(n):
            a = np.int32(out[y, i - bpp]) if i >= bpp else 0
            b = np.int32(out[y - 1, i]) if y else 0
            c = np.int32(out[y - 1, i - bpp]) if y and i >= bpp else 0
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            out[y, i] = (np.int32(raw[y, 1 + i]) + pred) & 255
'''

NUMBA_RUN = """
import sys, time
t0 = time.process_time()
import numpy as np
t1 = time.process_time()
import kernel
raw = np.load(sys.argv[1])
out = np.empty((raw.shape[0], raw.shape[1] - 1), np.uint8)
kernel.unfilter_paeth(raw[:1], out[:1], 3)
t2 = time.process_time()
kernel.unfilter_paeth(raw, out, 3)
print(t2 - t1, time.process_time() - t2)
"""


def best_cpu(fn, runs: int) -> float:
    """Least CPU seconds of ``runs`` calls of ``fn``."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def numba_times(folder: str, raw: np.ndarray, runs: int) -> tuple[float, float] | None:
    """(start-up, kernel) CPU seconds of the Numba kernel in fresh processes; None without Numba."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return None
    with open(os.path.join(folder, "kernel.py"), "w") as f:
        f.write(NUMBA_KERNEL)
    np.save(os.path.join(folder, "raw.npy"), raw)
    env = {**os.environ, "PYTHONPATH": folder, "NUMBA_CACHE_DIR": os.path.join(folder, "cache")}
    cmd = [sys.executable, "-c", NUMBA_RUN, os.path.join(folder, "raw.npy")]
    got = []
    for _ in range(runs + 1):  # the first run compiles into the cache
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.split()
        got.append((float(out[0]), float(out[1])))
    return min(s for s, _ in got[1:]), min(k for _, k in got[1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=3840)
    p.add_argument("--height", type=int, default=2160)
    p.add_argument("--runs", type=int, default=3, help="runs per figure; the least CPU time is shown")
    p.add_argument("--photo", default="astronaut", help="a name from tests/imgdiff/photos.py")
    args = p.parse_args(argv)
    img = photo_4k(args.photo, h=args.height, w=args.width)
    buffer = io.BytesIO()
    Image.fromarray(img).save(buffer, format="PNG")  # Pillow defaults: adaptive filters, zlib level 6
    data = buffer.getvalue()
    layout = png.layout(data)
    buf, filters = png_pair_inflate.inflate_one(layout, data)
    rows: list[tuple[str, float]] = [
        ("libpng, imagecodecs.png_decode (file)", best_cpu(lambda: imagecodecs.png_decode(data), args.runs)),
        (
            "libspng, imagecodecs.spng_decode (file)",
            best_cpu(lambda: imagecodecs.spng_decode(data), args.runs),
        ),
        (
            "libpng-apng, imagecodecs.apng_decode (file)",
            best_cpu(lambda: imagecodecs.apng_decode(data), args.runs),
        ),
        (
            "OpenCV, cv2.imdecode (file)",
            best_cpu(lambda: cv2.imdecode(np.frombuffer(data, np.uint8), -1), args.runs),
        ),
        (
            "Pillow, Image.open().load() (file)",
            best_cpu(lambda: np.asarray(Image.open(io.BytesIO(data))), args.runs),
        ),
        ("imgdiff.png.decode (file: ISA-L + unfilter)", best_cpu(lambda: png.decode(data), args.runs)),
        ("ISA-L inflate alone", best_cpu(lambda: png_pair_inflate.inflate_one(layout, data), args.runs)),
    ]
    raw = (
        np.frombuffer(buf, np.uint8, count=layout.height * layout.row_bytes).reshape(layout.height, -1).copy()
    )
    if png_spng.native_unfilter() is not None:
        native = best_cpu(lambda: png.unfilter(layout, buf, filters), args.runs)
        rows.append(("unfilter: native kernel", native))
        for kind, name in enumerate(("None", "Sub", "Up", "Avg", "Paeth")):
            raw[:, 0] = kind
            rows.append(
                (
                    f"unfilter: native kernel, every row {name}",
                    best_cpu(lambda: png_spng.unfilter_rows(layout, raw, 0, layout.height), args.runs),
                )
            )
    png_spng._NATIVE[:] = [None]  # the rows below: libspng and NumPy, as off x86-64 Linux
    rows.append(
        (
            "unfilter: libspng via ctypes, stored wrapper",
            best_cpu(lambda: png.unfilter(layout, buf, filters), args.runs),
        )
    )
    lib = png_spng._LIB[:]
    png_spng._LIB[:] = [None]  # the public-API fallback
    rows.append(
        (
            "unfilter: wrapper + imagecodecs.png_decode",
            best_cpu(lambda: png.unfilter(layout, buf, filters), args.runs),
        )
    )
    png_spng._LIB[:] = lib
    for kind, name in enumerate(("None", "Sub", "Up", "Avg", "Paeth")):
        raw[:, 0] = kind
        rows.append(
            (
                f"unfilter: libspng, every row {name}",
                best_cpu(lambda: png_spng.unfilter_rows(layout, raw, 0, layout.height), args.runs),
            )
        )
    raw[:, 0] = png.SUB
    sub = bytes([png.SUB]) * layout.height
    numpy_sub = best_cpu(lambda: png.unfilter(layout, raw, sub), args.runs)
    rows.append(("unfilter: NumPy delta_decode, every row Sub", numpy_sub))
    raw[:, 0] = png.PAETH
    with tempfile.TemporaryDirectory(prefix="png-decoders-") as folder:
        nb = numba_times(folder, raw, args.runs)  # raw: every row Paeth
    if nb is not None:
        rows.append(("unfilter: Numba kernel, every row Paeth", nb[1]))
        rows.append(("  Numba start-up (import + cached first call)", nb[0]))
    kinds = {k: filters.count(k) for k in sorted(set(filters))}
    print(f"{args.photo} {args.width}x{args.height} RGB written by Pillow; rows per filter type {kinds}")
    print(f"{'what':52s}{'CPU ms':>8s}")
    for name, secs in rows:
        print(f"{name:52s}{secs * 1e3:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
