"""``rl grpo``: GRPO / DAPO / GSPO post-training of a NoteVLM with hallucination rewards.

    rl grpo --config configs/rl/grpo_tiny.yaml --out runs/grpo --set init.model=runs/sft/model
    rl grpo --config configs/rl/grpo_tiny.yaml --set lora.enabled=true --set algo.beta=0.04

Writes OUT/config.yaml (resolved), OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/step-*/, OUT/model
(save_pretrained + processor; LoRA merged, adapter in OUT/adapter) and OUT/result.json. Re-running with
the same OUT resumes from the last checkpoint (``--no-resume`` starts over). One process only: under
``torchrun`` / ``accelerate launch`` (WORLD_SIZE > 1) it exits 2 with a one-line error.
"""

from __future__ import annotations

import argparse

from mm.config import load_config
from rl.trainers import grpo
from rl.trainers.dpo_cli import add_common_arguments, prepare_out, write_result


def configure(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, "rl.trainers.grpo.GRPOConfig")


def run(args: argparse.Namespace) -> int:
    overrides = list(args.overrides) + ([f"data.folder={args.data}"] if args.data else [])
    cfg = load_config(grpo.GRPOConfig, args.config, overrides)
    grpo.check_single_process()
    out, _ = prepare_out(args, cfg)
    summary = grpo.train(cfg, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress)
    write_result(out, summary)
    return 0
