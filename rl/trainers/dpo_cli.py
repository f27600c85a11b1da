"""``rl dpo``: DPO-family (and mDPO) post-training of a NoteVLM from its SFT checkpoint on the world's
notes, or of any model folder on your pair files.

    rl dpo --config configs/rl/dpo_tiny.yaml --out runs/dpo --set init.model=runs/sft/model
    rl dpo --config configs/rl/dpo_tiny.yaml --set lora.enabled=true --set data.pairs=pairs.jsonl
    rl dpo --model models/llava-1.5-7b-hf --pairs pairs.jsonl --image-folder images --out runs/dpo-llava

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
from mm.errors import UserError
from mm.train.common import barrier, init_distributed
from rl.trainers import dpo

FILES_HELP = """\
your model and pair files (--model): DIR is a NoteVLM folder or a transformers image-text-to-text
folder with its processor (LLaVA, Qwen2-VL, Idefics3/SmolVLM, ...). PAIRS.jsonl holds one JSON object
per line:
  {"image": "cat.jpg", "question": "What is on the mat?", "chosen": "A cat.", "rejected": "A dog."}
  {"image": ["a.png", "b.png"], "question": "What changed?", "chosen": "...", "rejected": "...",
   "id": "p2"}
image: a path relative to --image-folder, or a list of them (in prompt order); id is optional. The
released RLAIF-V (image {bytes, path} / image_path, question, chosen, rejected, idx, ...) and RLHF-V
(text = JSON of question/chosen/rejected, image, idx, ...) records are read with --pairs-format
rlaif-v / rlhf-v (auto: told apart by the first record's keys). A bad record stops the command with
FILE:LINE before anything is written. --config (optional) is a FilesDPOConfig YAML; without it the
defaults apply (LoRA r=8, sigmoid DPO beta=0.1, 8 pairs per step, 100 steps): `mm config show --kind
dpo_files` prints them all, ready to copy into a file.
OUT/model is the merged model (the LoRA beside it in OUT/adapter/); transformers families load it with
AutoModelForImageTextToText.from_pretrained.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(
        parser, "rl.trainers.dpo.DPOConfig (world form; required without --model) or "
        "rl.trainers.dpo_config.FilesDPOConfig (with --model; optional)", required=False,
    )  # fmt: skip
    files = parser.add_argument_group("your model and pair files")
    files.add_argument("--model", default=None, metavar="DIR", help="model folder: sets model.path")
    files.add_argument("--pairs", default=None, metavar="PAIRS.jsonl", help="pairs file: sets data.pairs")
    files.add_argument(
        "--image-folder", default=None, metavar="IMGS",
        help="folder the image paths are relative to (default: the pairs file's folder)",
    )  # fmt: skip
    files.add_argument(
        "--pairs-format", default=None, choices=["auto", "native", "rlaif-v", "rlhf-v"],
        help="record layout of --pairs (default auto)",
    )  # fmt: skip
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = FILES_HELP


def add_common_arguments(parser: argparse.ArgumentParser, cls: str, *, required: bool = True) -> None:
    """The flags ``rl dpo`` and ``rl grpo`` share."""
    parser.add_argument("--config", required=required, help=f"YAML file for {cls}")
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
    name = Path(args.config).stem if args.config else "dpo_files"
    out = Path(args.out) if args.out else Path(default_root) / name
    rank, _ = init_distributed()
    if rank == 0:
        if args.no_resume and (out / "checkpoints").exists():
            shutil.rmtree(out / "checkpoints")
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    barrier()
    return out, rank == 0


def run(args: argparse.Namespace) -> int:
    if args.model or args.pairs or args.image_folder or args.pairs_format:
        return run_files(args)
    if not args.config:
        raise UserError("pass --config (world form) or --model DIR --pairs PAIRS.jsonl (your files)")
    overrides = list(args.overrides) + ([f"data.folder={args.data}"] if args.data else [])
    cfg = load_config(dpo.DPOConfig, args.config, overrides)
    out, main = prepare_out(args, cfg)
    summary = dpo.train(cfg, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress)
    if main:
        write_result(out, summary)
    return 0


def run_files(args: argparse.Namespace) -> int:
    """``rl dpo --model DIR --pairs PAIRS.jsonl``: every pair is read and checked before OUT is touched."""
    from rl.pairs.importers import read_pair_file
    from rl.trainers import dpo_files
    from rl.trainers.dpo_config import FilesDPOConfig

    if args.data:
        raise UserError(
            "--data is the world form's note folder; with --model pass --pairs and --image-folder"
        )
    flags = {"model.path": args.model, "data.pairs": args.pairs, "data.image_folder": args.image_folder,
             "data.pairs_format": args.pairs_format}  # fmt: skip
    overrides = list(args.overrides) + [f"{k}={v}" for k, v in flags.items() if v is not None]
    cfg = load_config(FilesDPOConfig, args.config, overrides)
    if not cfg.model.path or not cfg.data.pairs:
        raise UserError(
            "the files form needs --model DIR and --pairs PAIRS.jsonl (or model.path, data.pairs)"
        )
    if not (Path(cfg.model.path) / "config.json").is_file():
        raise UserError(f"--model {cfg.model.path}: no config.json there; pass a saved model folder")
    folder = cfg.data.image_folder or str(Path(cfg.data.pairs).parent)
    pairs, fmt = read_pair_file(cfg.data.pairs, folder, cfg.data.pairs_format)
    out, main = prepare_out(args, cfg)
    summary = dpo_files.train(
        cfg, pairs, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress
    )
    if main:
        write_result(out, {"pairs_format": fmt, **summary})
    return 0


def write_result(out: Path, summary: dict[str, Any]) -> None:
    """OUT/result.json, and the summary without its last record on stdout."""
    (out / "result.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "last"}, default=str))
