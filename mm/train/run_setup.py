"""What every ``mm`` training command shares: its common flags and the run-folder set-up.

    add_run_arguments(parser, config_help="YAML file for ...", default_out="runs/train/<config name>")
    out, folder, main = prepare_run(args, cfg, default_root="runs/train", world_config=None)

``prepare_run`` joins the process group when launched by ``torchrun``/``accelerate launch``; on rank 0
it honours ``--no-resume`` (deletes OUT/checkpoints), generates the world into the data folder when it
is missing (``--data`` must exist), and writes the resolved ``OUT/config.yaml``; then all ranks meet.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import yaml

from mm.cli import main as mm_main
from mm.config import to_dict
from mm.errors import UserError
from mm.train import common


def add_run_arguments(parser: argparse.ArgumentParser, *, config_help: str, default_out: str) -> None:
    """``--config --out --data --set --no-resume --no-progress``."""
    parser.add_argument("--config", required=True, help=config_help)
    parser.add_argument("--out", default=None, help=f"output folder (default {default_out})")
    parser.add_argument("--data", default=None, help="note folder to use instead of the config's data.folder")
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set train.steps=50 optim.lr=1e-3 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--no-resume", action="store_true", help="ignore and delete existing checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def generate_world(folder: Path, notes: int, seed: int, world_config: str | None = None) -> None:
    """Run ``mm data world --out folder --notes N --seed S [--config C]``; fail loudly if it fails."""
    argv = ["data", "world", "--out", str(folder), "--notes", str(notes), "--seed", str(seed)]
    if world_config:
        argv += ["--config", world_config]
    rc = mm_main(argv)
    if rc != 0:
        raise UserError(f"generating the world data into {folder} failed (exit {rc})")


def prepare_run(
    args: argparse.Namespace, cfg: Any, *, default_root: str, world_config: str | None = None
) -> tuple[Path, Path, bool]:
    """Resolve OUT and the data folder, set the run folder up on rank 0; returns (out, folder, is_main)."""
    out = Path(args.out) if args.out else Path(default_root) / Path(args.config).stem
    folder = Path(args.data) if args.data else Path(cfg.data.folder)
    rank, _ = common.init_distributed()
    main = rank == 0
    if main:
        if args.no_resume and (out / "checkpoints").exists():
            shutil.rmtree(out / "checkpoints")
        if not folder.exists():
            if args.data:
                raise UserError(f"--data folder {folder} does not exist; generate it with `mm data world`")
            generate_world(folder, cfg.data.generate_notes, cfg.data.generate_seed, world_config)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    common.barrier()
    return out, folder, main
