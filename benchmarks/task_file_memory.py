"""Memory and time of reading an ``rl agent`` task file of phone photos, in RAM or memory-mapped.

    python benchmarks/task_file_memory.py                      # 96 photos 4032x3024, max_side 1024
    python benchmarks/task_file_memory.py --photos 8 --size 800x600 --max-side 256   # a quick look

Writes ``--photos`` JPEGs (quality 90, EXIF orientation 6, as a phone stores a portrait photo; made from
the real photos of ``tests/imgdiff/photos.py``, upscaled) and a task file with one task per photo, then
reads the file in a fresh process each way, ``--runs`` times:

- ``in RAM, full-size JPEG decode``: as below with Pillow's JPEG ``draft`` turned off (the reader before
  it decoded JPEGs at a reduced scale), the peer of the row below;
- ``in RAM``: ``read_task_file(path, max_side=M)``, every decoded photo an array of the process;
- ``cache, cold``: with ``image_cache`` set to an empty folder (decode, write each ``.npy``, map it);
- ``cache, warm``: the same folder again (nothing decoded: a resumed run, or the eval after training).

Each row, medians: the wall seconds of the read; after it, with every pixel touched once, the private
(anonymous) memory the process holds beyond what it held before, and the file pages it has mapped
(the page cache's: shared between processes, dropped under memory pressure and read back on use). The
decoded size (``3 * H * W`` summed) is printed for scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from rl.agent.task_file import read_task_file

def rss():  # MiB resident: private (anonymous) and mapped from files
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) / 1024 for k in ("RssAnon", "RssFile")}

path, max_side, cache = sys.argv[2], int(sys.argv[3]), (sys.argv[4] or None)
if sys.argv[5] == "full":  # the reader before it decoded JPEGs at a reduced scale
    from PIL import JpegImagePlugin
    JpegImagePlugin.JpegImageFile.draft = lambda self, mode, size: None
before = rss()
t = time.perf_counter()
tasks = read_task_file(path, max_side=max_side, image_cache=cache)
seconds = time.perf_counter() - t
total = sum(int(s.sum() % 7) for task in tasks for s in task.sources)  # touch every pixel once
after = rss()
decoded = sum(s.nbytes for task in tasks for s in task.sources) / 2**20
print(json.dumps({"seconds": seconds, "anon_mb": after["RssAnon"] - before["RssAnon"],
                  "file_mb": after["RssFile"] - before["RssFile"], "decoded_mb": decoded}))
"""


def write_photos(folder: Path, n: int, width: int, height: int) -> Path:
    """``n`` phone-style JPEGs and a task file naming them; returns the task file."""
    import cv2
    from PIL import Image

    sys.path.insert(0, str(ROOT))
    from tests.imgdiff.photos import PHOTOS, photo

    (folder / "photos").mkdir(parents=True)
    lines = []
    for i in range(n):
        # stored landscape (width x height) with orientation 6: shown as a portrait photo
        src = cv2.resize(photo(PHOTOS[i % len(PHOTOS)]), (width, height), interpolation=cv2.INTER_CUBIC)
        src[i % height, :, i % 3] ^= 0x55  # each photo its own bytes
        exif = Image.Exif()
        exif[0x0112] = 6
        Image.fromarray(src).save(folder / f"photos/{i}.jpg", quality=90, exif=exif)
        lines.append(
            json.dumps({"id": i, "image": f"photos/{i}.jpg", "question": "What is it?", "answer": "x"})
        )
    path = folder / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def measure(path: Path, max_side: int, cache: str, runs: int, decode: str = "draft") -> dict[str, float]:
    rows = []
    for _ in range(runs):
        cmd = [sys.executable, "-c", _CHILD, str(ROOT), str(path), str(max_side), cache, decode]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--photos", type=int, default=96)
    p.add_argument("--size", default="4032x3024", help="stored WxH of each JPEG")
    p.add_argument("--max-side", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    width, height = (int(x) for x in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        path = write_photos(Path(tmp), args.photos, width, height)
        cache = Path(tmp) / "cache"
        out = {"in RAM, full-size JPEG decode": measure(path, args.max_side, "", args.runs, "full")}
        out["in RAM"] = measure(path, args.max_side, "", args.runs)
        cold = []
        for _ in range(args.runs):  # each cold run from an empty folder
            for f in cache.glob("*.npy"):
                f.unlink()
            cold.append(measure(path, args.max_side, str(cache), 1))
        out["cache, cold"] = {k: statistics.median(r[k] for r in cold) for k in cold[0]}
        out["cache, warm"] = measure(path, args.max_side, str(cache), args.runs)
    print(f"{args.photos} JPEGs {args.size}, max_side {args.max_side}, median of {args.runs} runs")
    print(f"decoded pixels: {out['in RAM']['decoded_mb']:.0f} MiB")
    print("| read | wall (s) | private memory held (MiB) | file pages mapped (MiB) |\n|---|---|---|---|")
    for name, r in out.items():
        print(f"| {name} | {r['seconds']:.2f} | {r['anon_mb']:.0f} | {r['file_mb']:.0f} |")
    return out


if __name__ == "__main__":
    main()
