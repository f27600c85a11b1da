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
import time

from mm.config import load_config
from mm.data.tokenizer import load_tokenizer
from mm.train import pretrain
from mm.train.run_setup import add_run_arguments, prepare_run


def configure(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(
        parser,
        config_help="YAML file for mm.train.pretrain.PretrainConfig",
        default_out="runs/pretrain/<config name>",
    )


def run(args: argparse.Namespace) -> int:
    cfg = load_config(pretrain.PretrainConfig, args.config, args.overrides)
    out, folder, main = prepare_run(
        args, cfg, default_root="runs/pretrain", world_config=cfg.data.world_config
    )

    tok = load_tokenizer()
    t_load = time.perf_counter()
    max_len, max_images = cfg.model.text.max_len, cfg.model.max_images
    train_data = pretrain.load_split(
        folder, cfg.data.train_split, tokenizer=tok, max_images=max_images, max_len=max_len,
        tag_classes=pretrain.tag_classes(cfg), tag_grid=pretrain.tag_grid(cfg),
    )  # fmt: skip
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
