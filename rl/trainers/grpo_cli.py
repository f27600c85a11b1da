"""``rl grpo``: GRPO / DAPO / GSPO post-training with hallucination (or your own) rewards.

On the world's notes (a NoteVLM from ``mm train``)::

    rl grpo --config configs/rl/grpo_tiny.yaml --out runs/grpo --set init.model=runs/sft/model
    rl grpo --config configs/rl/grpo_tiny.yaml --set lora.enabled=true --set algo.beta=0.04

On any model folder and a prompt file (``docs/byo.md``, "GRPO on your files")::

    rl grpo --model models/qwen2-vl-2b --prompts prompts.jsonl --image-folder images --reward chair \\
        --out runs/grpo-qwen --config configs/rl/grpo_files.yaml --set lora.enabled=true
    rl grpo --model DIR --prompts P.jsonl --reward my_rewards:brevity --set rollout.engine=vllm

Writes OUT/config.yaml (resolved), OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/step-*/, OUT/model
(a complete model folder with its processor; LoRA merged, the adapter in OUT/adapter or OUT/model/adapter)
and OUT/result.json. Re-running with the same OUT resumes from the last checkpoint (``--no-resume``
starts over). Data parallel under ``torchrun`` / ``accelerate launch``: each process samples whole groups
of every step's prompts (``data.prompts_per_step`` must divide by the number of processes) and the run
equals one process on the same global batch; only rank 0 writes (:mod:`rl.trainers.grpo_shard`).
"""

from __future__ import annotations

import argparse
import json

from mm.config import load_config
from rl.trainers import grpo
from rl.trainers.dpo_cli import prepare_out, write_result
from rl.trainers.grpo_shard import check_world

FILE_FLAGS = {"model": "model.path", "prompts": "data.prompts", "image_folder": "data.image_folder",
              "reward": "reward.fn"}  # fmt: skip
"""Flags of the prompt-file form -> the GRPOFilesConfig keys they set."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default=None,
        help="YAML file: rl.trainers.grpo.GRPOConfig (world notes; required without --prompts) or, with "
        "--prompts, rl.trainers.grpo_files_config.GRPOFilesConfig (default: its defaults)",
    )  # fmt: skip
    parser.add_argument("--out", default=None, help="output folder (default runs/rl/<config name>)")
    parser.add_argument("--data", default=None, help="note folder to use instead of the config's data.folder")
    parser.add_argument(
        "--model", default=None,
        help="model folder: NoteVLM or a transformers image-text-to-text model + processor (with --prompts)",
    )  # fmt: skip
    parser.add_argument(
        "--prompts", default=None, help="prompt file (JSONL: image, question, optional id, ...)"
    )
    parser.add_argument(
        "--image-folder", default=None, help="folder the prompt file's image paths start from"
    )
    parser.add_argument(
        "--reward", default=None,
        help="reward: hallucination, chair, yesno (ground truth in the records), labeler or rm:DIR "
        "(no ground truth) or module:function taking (prompt, completion, record)",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set train.steps=50 optim.lr=1e-5 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--no-resume", action="store_true", help="ignore and delete existing checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    from mm.errors import UserError

    if any(getattr(args, k) is not None for k in FILE_FLAGS):
        return run_files(args)
    if args.config is None:
        raise UserError("pass --config FILE (world notes) or --model DIR --prompts P.jsonl (your files)")
    overrides = list(args.overrides) + ([f"data.folder={args.data}"] if args.data else [])
    cfg = load_config(grpo.GRPOConfig, args.config, overrides)
    check_world(cfg.data.prompts_per_step)
    out, main = prepare_out(args, cfg)
    summary = grpo.train(cfg, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress)
    if main:
        write_result(out, summary)
    return 0


def run_files(args: argparse.Namespace) -> int:
    """The prompt-file form: everything is checked (model folder, prompts, images, reward) before OUT."""
    from mm.errors import UserError
    from rl.trainers import grpo_files
    from rl.trainers.grpo_files_config import GRPOFilesConfig

    if args.data is not None:
        raise UserError("--data is the world-notes form; with --prompts give --image-folder instead")
    flags = [
        f"{key}={json.dumps(getattr(args, k))}"
        for k, key in FILE_FLAGS.items()
        if getattr(args, k) is not None
    ]
    cfg = load_config(GRPOFilesConfig, args.config, flags + list(args.overrides))
    check_world(cfg.data.prompts_per_step)
    records, reward = grpo_files.prepare(cfg)
    if args.out is None and args.config is None:
        args.out = "runs/rl/grpo_files"
    out, main = prepare_out(args, cfg)
    summary = grpo_files.train(
        cfg, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress, records=records,
        reward=reward,
    )  # fmt: skip
    if main:
        write_result(out, summary)
    return 0
