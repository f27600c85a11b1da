"""Speed of ``mm data world``: CPU per stage in one process, then the real CLI end to end.

    python benchmarks/world_speed.py                       # 2,000 notes per stage, CLI on 20,000
    python benchmarks/world_speed.py --notes 200 --cli-notes 500 --workers 1

Stages (CPU seconds of this process, ``time.process_time``, per 1,000 notes): ``generate``
(scenes, rendering, texts: :func:`mm.world.generate.generate_note`), ``png ours``
(:func:`mm.world.png.encode_png`) next to ``png cv2 (before)`` (``cv2.imencode`` with Huffman-only
settings, the OpenCV encoder it is compared with), ``json`` (the notes.jsonl lines), ``files`` (create +
write + close each PNG).
The CLI row runs ``python -m mm data world`` in a subprocess and reports wall seconds and CPU
seconds (user + sys of the child and its workers) with the load average, because the machine is
shared: compare CPU seconds across runs, wall seconds only within one.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _stages(notes: int) -> list[tuple[str, float]]:
    import cv2

    from mm.data.format import note_line
    from mm.world.config import WorldConfig
    from mm.world.generate import generate_note
    from mm.world.png import encode_png

    cfg = WorldConfig(notes=notes)
    pc = time.process_time
    t = pc()
    made = [generate_note(cfg, i) for i in range(notes)]
    rows = [("generate", pc() - t)]
    images = [img for _, imgs in made for img in imgs]
    t = pc()
    blobs = [encode_png(img) for img in images]
    rows.append(("png ours", pc() - t))
    params = [cv2.IMWRITE_PNG_COMPRESSION, 1, cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_HUFFMAN_ONLY]
    t = pc()
    for img in images:
        cv2.imencode(".png", img[:, :, ::-1], params)
    rows.append(("png cv2 (before)", pc() - t))
    t = pc()
    for note, _ in made:
        note_line(note)
    rows.append(("json", pc() - t))
    with tempfile.TemporaryDirectory() as d:
        dir_fd = os.open(d, os.O_RDONLY)
        t = pc()
        for k, data in enumerate(blobs):
            fd = os.open(f"{k}.png", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=dir_fd)
            os.write(fd, data)
            os.close(fd)
        rows.append(("files", pc() - t))
        os.close(dir_fd)
    print(f"{len(images)} images, {sum(map(len, blobs)) / len(blobs):.0f} bytes per PNG (ours)")
    return rows


def _cli(notes: int, workers: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        cmd = [sys.executable, "-m", "mm", "data", "world", "--out", str(Path(d) / "w")]
        cmd += ["--notes", str(notes), "--workers", str(workers), "--no-progress"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--notes", type=int, default=2000, help="notes for the per-stage timings")
    p.add_argument("--cli-notes", type=int, default=20000, help="notes for the end-to-end CLI run (0: skip)")
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="CLI --workers")
    args = p.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'stage':<18} {'CPU s / 1000 notes':>20}")
    for name, sec in _stages(args.notes):
        print(f"{name:<18} {sec / args.notes * 1000:>20.3f}")
    if args.cli_notes:
        wall, cpu = _cli(args.cli_notes, args.workers)
        print(
            f"mm data world --notes {args.cli_notes} --workers {args.workers}: {wall:.1f} s wall, "
            f"{cpu:.1f} s CPU (user+sys), load average {os.getloadavg()[0]:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
