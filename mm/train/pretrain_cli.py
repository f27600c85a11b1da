"""``mm pretrain``: contrastive (CLIP / SigLIP) pretraining of the note encoder against a text encoder.

    mm pretrain --config configs/mm/pretrain_tiny.yaml [--out DIR] [--data DIR] [--set key=value ...]
    torchrun --nproc_per_node 2 -m mm pretrain --config ...        # DDP (gloo on CPU), same flags

Writes OUT/config.yaml (resolved), OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/step-*/ and
OUT/result.json (final metrics, wall and CPU seconds of training, data-loading seconds, machine load).
Re-running with the same OUT resumes from the last checkpoint (``--no-resume`` starts
over, deleting OUT/checkpoints). The world data is generated into ``data.folder`` if it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML file for mm.train.pretrain.PretrainConfig")
    parser.add_argument("--out", default=None, help="output folder (default runs/pretrain/<config name>)")
    parser.add_argument("--data", default=None, help="note folder to use instead of the config's data.folder")
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set train.steps=50 loss.kind=siglip",
    )  # fmt: skip
    parser.add_argument("--no-resume", action="store_true", help="ignore and delete existing checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    import yaml

    from mm.config import load_config, to_dict
    from mm.train import common, pretrain

    cfg = load_config(pretrain.PretrainConfig, args.config, args.overrides)
    out = Path(args.out) if args.out else Path("runs/pretrain") / Path(args.config).stem
    folder = Path(args.data) if args.data else Path(cfg.data.folder)
    rank, _ = common.init_distributed()
    main = rank == 0
    if main:
        if args.no_resume and (out / "checkpoints").exists():
            shutil.rmtree(out / "checkpoints")
        if not folder.exists():
            if args.data:
                from mm.errors import UserError

                raise UserError(f"--data folder {folder} does not exist; generate it with `mm data world`")
            _generate_world(folder, cfg.data.generate_notes, cfg.data.generate_seed, cfg.data.world_config)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    common.barrier()

    from mm.data.tokenizer import load_tokenizer

    tok = load_tokenizer()
    t_load = time.perf_counter()
    max_len, max_images = cfg.model.text.max_len, cfg.model.max_images
    train_data = pretrain.load_split(
        folder, cfg.data.train_split, tokenizer=tok, max_images=max_images, max_len=max_len
    )
    eval_data = pretrain.load_split(
        folder, cfg.data.eval_split, tokenizer=tok, max_images=max_images, max_len=max_len,
        limit=cfg.data.eval_notes,
    )  # fmt: skip
    load_seconds = time.perf_counter() - t_load
    result = pretrain.train(
        cfg,
        out_dir=out,
        train_data=train_data,
        eval_data=eval_data,
        vocab_size=len(tok),
        resume=not args.no_resume,
        show_progress=not args.no_progress,
    )
    if main:
        summary = {
            "step": result.step,
            "train_seconds": round(result.seconds, 2),
            "train_cpu_seconds": round(result.cpu_seconds, 2),
            "load_seconds": round(load_seconds, 2),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "train_notes": len(train_data),
            "eval_notes": len(eval_data),
            **result.metrics,
        }
        (out / "result.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary))
    return 0


def _generate_world(folder: Path, notes: int, seed: int, world_config: str | None) -> None:
    """Run ``mm data world --out folder --notes N --seed S [--config C]``; fail loudly if it fails."""
    from mm.cli import main as mm_main
    from mm.errors import UserError

    argv = ["data", "world", "--out", str(folder), "--notes", str(notes), "--seed", str(seed)]
    if world_config:
        argv += ["--config", world_config]
    rc = mm_main(argv)
    if rc != 0:
        raise UserError(f"generating the world data into {folder} failed (exit {rc})")
