"""``mm train``: align or SFT a NoteVLM (full or LoRA) on note captions and yes/no questions.

    mm train --config configs/mm/align_tiny.yaml --out runs/align [--set init.pretrain=runs/pretrain]
    mm train --config configs/mm/sft_tiny.yaml --out runs/sft --set init.model=runs/align/model
    accelerate launch --multi_gpu --num_processes 2 -m mm train --config ...   # DDP, same flags
    (on CPU: CUDA_VISIBLE_DEVICES= and gloo; `accelerate launch --cpu --num_processes 2` starts ONE
    process, as accelerate's CPU multi-process path needs MPI. torchrun --nproc_per_node 2 works too.)

Writes OUT/config.yaml (resolved), OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/step-*/,
OUT/model/ (save_pretrained + processor/tokenizer; LoRA runs are merged, the adapter is in OUT/adapter/)
and OUT/result.json. Re-running with the same OUT resumes from the last checkpoint (``--no-resume``
starts over). The world data is generated into ``data.folder`` if it is missing.
"""

from __future__ import annotations

import argparse
import json

from mm.config import load_config
from mm.data.format import read_notes
from mm.errors import UserError
from mm.train import sft
from mm.train.run_setup import add_run_arguments, prepare_run


def configure(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(
        parser, config_help="YAML file for mm.train.sft.TrainConfig", default_out="runs/train/<config name>"
    )


def run(args: argparse.Namespace) -> int:
    cfg = load_config(sft.TrainConfig, args.config, args.overrides)
    out, folder, main = prepare_run(args, cfg, default_root="runs/train")
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
