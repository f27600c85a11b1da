"""``rl dpo``: DPO-family (and mDPO) post-training of a NoteVLM from its SFT checkpoint.

    rl dpo --config configs/rl/dpo_tiny.yaml --out runs/dpo --set init.model=runs/sft/model
    rl dpo --config configs/rl/dpo_tiny.yaml --set lora.enabled=true --set data.pairs=pairs.jsonl

Writes OUT/config.yaml (resolved), OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/step-*/, OUT/model
(save_pretrained + processor; LoRA merged, adapter in OUT/adapter) and OUT/result.json. Re-running with
the same OUT resumes from the last checkpoint (``--no-resume`` starts over). Under ``torchrun`` /
``accelerate launch`` the processes train data parallel (each its shard of every step's pairs); only
rank 0 writes OUT.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from mm.config import load_config, to_dict
from mm.train.common import barrier, init_distributed
from rl.trainers import dpo


def configure(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, "rl.trainers.dpo.DPOConfig")


def add_common_arguments(parser: argparse.ArgumentParser, cls: str) -> None:
    """The flags ``rl dpo`` and ``rl grpo`` share."""
    parser.add_argument("--config", required=True, help=f"YAML file for {cls}")
    parser.add_argument("--out", default=None, help="output folder (default runs/rl/<config name>)")
    parser.add_argument("--data", default=None, help="note folder to use instead of the config's data.folder")
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set train.steps=50 optim.lr=1e-5 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--no-resume", action="store_true", help="ignore and delete existing checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def prepare_out(args: argparse.Namespace, cfg: Any, default_root: str = "runs/rl") -> tuple[Path, bool]:
    """Join the process group (torchrun / accelerate launch); on rank 0 resolve OUT, apply --no-resume and
    write OUT/config.yaml; then all ranks meet. Returns (out, is_main)."""
    out = Path(args.out) if args.out else Path(default_root) / Path(args.config).stem
    rank, _ = init_distributed()
    if rank == 0:
        if args.no_resume and (out / "checkpoints").exists():
            shutil.rmtree(out / "checkpoints")
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    barrier()
    return out, rank == 0


def run(args: argparse.Namespace) -> int:
    overrides = list(args.overrides) + ([f"data.folder={args.data}"] if args.data else [])
    cfg = load_config(dpo.DPOConfig, args.config, overrides)
    out, main = prepare_out(args, cfg)
    summary = dpo.train(cfg, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress)
    if main:
        write_result(out, summary)
    return 0


def write_result(out: Path, summary: dict[str, Any]) -> None:
    """OUT/result.json, and the summary without its last record on stdout."""
    (out / "result.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "last"}, default=str))
