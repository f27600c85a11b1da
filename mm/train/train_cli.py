"""``mm train``: align or SFT a NoteVLM (full or LoRA) on note captions and yes/no questions.

    mm train --config configs/mm/align_tiny.yaml --out runs/align [--set init.pretrain=runs/pretrain]
    mm train --config configs/mm/sft_tiny.yaml --out runs/sft --set init.model=runs/align/model
    accelerate launch -m mm train --config ...          # DDP (gloo on CPU), same flags

Writes OUT/config.yaml (resolved), OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/step-*/,
OUT/model/ (save_pretrained + processor/tokenizer; LoRA runs are merged, the adapter is in OUT/adapter/)
and OUT/result.json. Re-running with the same OUT resumes from the last checkpoint (``--no-resume``
starts over). The world data is generated into ``data.folder`` if it is missing.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML file for mm.train.sft.TrainConfig")
    parser.add_argument("--out", default=None, help="output folder (default runs/train/<config name>)")
    parser.add_argument("--data", default=None, help="note folder to use instead of the config's data.folder")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.steps=50 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--no-resume", action="store_true", help="ignore and delete existing checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    import yaml

    from mm.config import load_config, to_dict
    from mm.data.format import read_notes
    from mm.errors import UserError
    from mm.train import common, sft

    cfg = load_config(sft.TrainConfig, args.config, args.overrides)
    out = Path(args.out) if args.out else Path("runs/train") / Path(args.config).stem
    folder = Path(args.data) if args.data else Path(cfg.data.folder)
    rank, _ = common.init_distributed()
    main = rank == 0
    if main:
        if args.no_resume and (out / "checkpoints").exists():
            shutil.rmtree(out / "checkpoints")
        if not folder.exists():
            if args.data:
                raise UserError(f"--data folder {folder} does not exist; generate it with `mm data world`")
            generate_world(folder, cfg.data.generate_notes, cfg.data.generate_seed)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    common.barrier()
    train_notes = read_notes(folder, cfg.data.train_split)
    if cfg.data.train_notes:
        train_notes = train_notes[: cfg.data.train_notes]
    if not train_notes:
        raise UserError(f"{folder} has no notes in split {cfg.data.train_split!r}")
    eval_notes = read_notes(folder, cfg.data.eval_split)
    result = sft.train(
        cfg,
        out_dir=out,
        train_notes=train_notes,
        eval_notes=eval_notes,
        root=folder,
        resume=not args.no_resume,
        show_progress=not args.no_progress,
    )
    if main:
        summary = result_summary(result, train_notes=len(train_notes), stage=cfg.train.stage)
        (out / "result.json").write_text(json.dumps(summary, indent=1, default=str))
        print(json.dumps({k: v for k, v in summary.items() if k != "sample_captions"}, default=str))
    return 0


def result_summary(result, *, train_notes: int, stage: str) -> dict:
    """The JSON written to OUT/result.json."""
    m = dict(result.metrics)
    captions = m.pop("_captions", [])
    return {
        "stage": stage,
        "step": result.step,
        "train_seconds": round(result.seconds, 2),
        "step_seconds": round(result.step_seconds, 4),
        "train_notes": train_notes,
        "trainable": result.trainable,
        **m,
        "sample_captions": captions,
    }


def generate_world(folder: Path, notes: int, seed: int) -> None:
    """Run ``mm data world --out folder --notes N --seed S``; fail loudly if it fails."""
    from mm.cli import main as mm_main
    from mm.errors import UserError

    rc = mm_main(["data", "world", "--out", str(folder), "--notes", str(notes), "--seed", str(seed)])
    if rc != 0:
        raise UserError(f"generating the world data into {folder} failed (exit {rc})")
