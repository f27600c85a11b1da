"""``mm compare-fusion``: train fusion kinds / scopes / visibility modes at the same K on the same notes.

    mm compare-fusion --config configs/mm/compare_tiny.yaml [--out DIR] [--data DIR] [--set key=value ...]

Writes OUT/<variant>/{pretrain,align,sft}/ (normal run folders; <variant> as
`mm.train.compare.variant_folder`, e.g. `qformer-note-own-s1`), OUT/compare.md (one row per variant, mean
and 95% interval over seeds) and OUT/compare.json (one row per variant and seed); the table is rewritten
after every run, so a partial comparison is readable. The world data is generated into
``sft.data.folder`` when it is missing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from mm.config import load_config, to_dict
from mm.errors import UserError
from mm.train import compare
from mm.train.run_setup import generate_world


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML file for mm.train.compare.CompareConfig")
    parser.add_argument("--out", default=None, help="output folder (default runs/compare/<config name>)")
    parser.add_argument("--data", default=None, help="note folder to use instead of sft.data.folder")
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set sft.train.steps=50 align_steps=10 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--progress", action="store_true", help="show progress bars")


def run(args: argparse.Namespace) -> int:
    from mm.train.common import is_main_process, join_launch, on_rank0

    cfg = load_config(compare.CompareConfig, args.config, args.overrides)
    out = Path(args.out) if args.out else Path("runs/compare") / Path(args.config).stem
    folder = Path(args.data) if args.data else Path(cfg.sft.data.folder)
    join_launch()  # under torchrun each variant's stages are data parallel; rank 0 writes and prints
    if not folder.exists():
        if args.data:
            raise UserError(f"--data folder {folder} does not exist; generate it with `mm data world`")
        on_rank0(lambda: generate_world(folder, cfg.sft.data.generate_notes, cfg.sft.data.generate_seed))
    on_rank0(lambda: _write_config(cfg, out))
    rows: list[dict] = []
    pretrained: dict = {}
    per_note = f", {cfg.note_budget} tokens per note in note scope" if cfg.note_budget else ""
    header = f"# Fusion comparison at K={cfg.budget}{per_note} on {folder}\n\n"
    for seed in cfg.seeds:
        for kind, scope, visibility in cfg.variants():
            name = compare.variant_folder(kind, scope, visibility, seed, cfg.note_budget)
            row = compare.run_variant(
                cfg, kind, folder=folder, out=out / name, scope=scope, visibility=visibility, seed=seed,
                pretrained=pretrained, show_progress=args.progress,
            )  # fmt: skip
            rows.append(row)
            md, _ = on_rank0(lambda: compare.write_table(rows, out, header))
            if is_main_process():
                print(json.dumps(row))
    if is_main_process():
        print(md.read_text())
    return 0


def _write_config(cfg: compare.CompareConfig, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
