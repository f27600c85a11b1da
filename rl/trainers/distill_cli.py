"""``rl distill``: on-policy distillation of a student from a teacher that shares its tokenizer.

On the world's notes (caption requests; e.g. a small NoteVLM SFT from a bigger one)::

    rl distill --student runs/sft-small/model --teacher runs/sft-big/model --config configs/rl/distill.yaml \\
        --out runs/distill
    rl distill ... --set loss.kind=gjsd loss.beta=0.5 data.lmbda=0.5      # GKD
    rl distill ... --set loss.kind=sft_on_teacher                         # off-policy KD baseline

On a prompt file (the ``rl grpo --prompts`` format, with an optional ``answer`` per record)::

    rl distill --student DIR --teacher DIR --prompts prompts.jsonl --image-folder images --out runs/d

Writes OUT/config.yaml (resolved), OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/, OUT/model (a
complete model folder with its processor; LoRA merged, the adapter in OUT/adapter) and OUT/result.json.
Re-running with the same OUT resumes from the last checkpoint (``--no-resume`` starts over).
"""

from __future__ import annotations

import argparse
import json

from mm.config import load_config
from rl.trainers.dpo_cli import prepare_out, write_result

FLAGS = {"student": "student.path", "teacher": "teacher.path", "prompts": "data.prompts",
         "image_folder": "data.image_folder", "data": "data.folder"}  # fmt: skip
"""Flags -> the DistillConfig keys they set."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--student", default=None, metavar="DIR", help="model folder of the student (trained)"
    )
    parser.add_argument(
        "--teacher",
        default=None,
        metavar="DIR",
        help="model folder of the teacher (frozen; same tokenizer as the student)",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="YAML for rl.trainers.distill_config.DistillConfig (default: its defaults)",
    )
    parser.add_argument(
        "--prompts",
        default=None,
        metavar="P.jsonl",
        help="prompt file (image, question, optional answer); default: the world's notes",
    )
    parser.add_argument(
        "--image-folder",
        default=None,
        metavar="DIR",
        help="folder the prompt file's image paths start from (default: the file's folder)",
    )
    parser.add_argument("--data", default=None, metavar="DIR", help="note folder instead of data.folder")
    parser.add_argument("--out", default=None, help="output folder (default runs/rl/<config name>)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="override config keys, e.g. --set train.steps=50 loss.kind=gjsd (repeatable)",
    )
    parser.add_argument("--no-resume", action="store_true", help="ignore and delete existing checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from rl.trainers import distill
    from rl.trainers.distill_config import DistillConfig

    flags = [
        f"{key}={json.dumps(getattr(args, k))}" for k, key in FLAGS.items() if getattr(args, k) is not None
    ]
    cfg = load_config(DistillConfig, args.config, flags + list(args.overrides))
    if args.out is None and args.config is None:
        args.out = "runs/rl/distill"
    out, main = prepare_out(args, cfg)
    summary = distill.train(cfg, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress)
    if main:
        write_result(out, summary)
    return 0
