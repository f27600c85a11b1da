"""``mm data``: make note folders (the note format of :mod:`mm.data.format`).

mm data world --config configs/mm/world_default.yaml --out DIR [--notes N --seed S]
mm data coco --captions captions_val2017.json --instances instances_val2017.json --images DIR --out DIR
mm data llava --json llava_instruct.json --images DIR --out DIR
mm data pope --questions coco_pope_random.jsonl --images DIR --out DIR
mm data stats DIR          # co-occurrence statistics of a note folder (JSON on stdout)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from mm.config import load_config
from mm.data import readers
from mm.data.format import read_notes
from mm.world.config import WorldConfig
from mm.world.generate import with_notes, write_world
from mm.world.stats import cooccurrence_stats


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="SOURCE")

    w = sub.add_parser(
        "world", help="generate the synthetic note world", description="generate the synthetic world"
    )
    w.add_argument("--config", default=None, help="WorldConfig YAML (default: built-in defaults)")
    w.add_argument("--out", required=True, help="output folder (must be new or empty unless --overwrite)")
    w.add_argument("--notes", type=int, default=None, help="number of notes (overrides the config)")
    w.add_argument("--seed", type=int, default=None, help="seed (overrides the config)")
    w.add_argument(
        "--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override WorldConfig keys, e.g. --set notes=100 image_size=32 (repeatable)",
    )  # fmt: skip
    w.add_argument(
        "--workers", type=int, default=min(4, os.cpu_count() or 1), help="processes (default: cores)"
    )
    w.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    w.add_argument("--no-progress", action="store_true", help="no progress bar")

    c = sub.add_parser(
        "coco", help="COCO captions + instances -> single-image notes", description="convert COCO"
    )
    c.add_argument("--captions", required=True, help="captions_*.json")
    c.add_argument("--instances", default=None, help="instances_*.json (objects; optional)")
    _common(c)

    ll = sub.add_parser("llava", help="LLaVA conversation JSON -> notes", description="convert LLaVA JSON")
    ll.add_argument("--json", required=True, help="LLaVA JSON: a list of {id, image, conversations}")
    _common(ll)

    p = sub.add_parser("pope", help="POPE question JSONL -> notes with questions", description="convert POPE")
    p.add_argument(
        "--questions", required=True, help="POPE JSONL: {question_id, image, text, label} per line"
    )
    _common(p)

    s = sub.add_parser(
        "stats", help="co-occurrence statistics of a note folder", description="folder statistics"
    )
    s.add_argument("folder", help="note folder")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--images", required=True, help="folder holding the image files")
    p.add_argument("--out", required=True, help="output folder (must be new or empty unless --overwrite)")
    p.add_argument("--split", default="train", choices=["train", "val", "test"], help="split of every note")
    p.add_argument(
        "--strict", action="store_true", help="stop at the first bad record instead of skipping it"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")


def run(args: argparse.Namespace) -> int:
    if args.data_command == "world":
        return _world(args)
    if args.data_command == "stats":
        print(json.dumps(cooccurrence_stats(read_notes(args.folder)), indent=1))
        return 0

    if args.data_command == "coco":
        notes, report = readers.read_coco(
            args.captions, args.instances, images=args.images, split=args.split, strict=args.strict
        )
    elif args.data_command == "llava":
        notes, report = readers.read_llava(
            args.json, images=args.images, split=args.split, strict=args.strict
        )
    else:
        notes, report = readers.read_pope(
            args.questions, images=args.images, split=args.split, strict=args.strict
        )
    readers.write_converted(notes, images=args.images, out=args.out, overwrite=args.overwrite)
    print(report.summary(), file=sys.stderr)
    print(f"wrote {len(notes)} notes to {args.out}")
    return 0


def _world(args: argparse.Namespace) -> int:
    cfg = with_notes(load_config(WorldConfig, args.config, args.set), notes=args.notes, seed=args.seed)
    t0 = time.perf_counter()
    notes = write_world(
        cfg, args.out, workers=args.workers, overwrite=args.overwrite, progress=not args.no_progress
    )
    n_img = sum(len(n.images) for n in notes)
    print(f"wrote {len(notes)} notes ({n_img} images) to {args.out} in {time.perf_counter() - t0:.1f}s")
    stats = json.loads((Path(args.out) / "stats.json").read_text())["overall"]
    keys = ("p_partner_given_anchor", "partner_hidden_with_anchor", "absent_partner_images")
    print("co-occurrence: " + ", ".join(f"{k}={stats[k]:.3f}" for k in keys if stats[k] is not None))
    return 0
