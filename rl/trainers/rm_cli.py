"""``rl rm``: train a Bradley-Terry reward model on preference pairs (any model folder, LoRA or full).

    rl rm --model runs/sft/model --pairs pairs.jsonl --out runs/rm --set train.steps=200
    rl grpo --config configs/rl/grpo_tiny.yaml --set reward.source=rm:runs/rm

The pairs file is what ``rl dpo --pairs`` reads (native, RLAIF-V or RLHF-V records). Writes
OUT/config.yaml, OUT/metrics.jsonl (eval/accuracy: held-out pair accuracy), OUT/curves.png,
OUT/checkpoints/, OUT/model (+ OUT/adapter), OUT/value_head.pt, OUT/reward_model.json, OUT/result.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import yaml

from mm.config import load_config, to_dict
from mm.errors import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="YAML for rl.trainers.rm_config.RMConfig (optional)")
    parser.add_argument("--model", default=None, metavar="DIR", help="model folder under the value head")
    parser.add_argument("--pairs", default=None, metavar="PAIRS.jsonl", help="preference pairs file")
    parser.add_argument(
        "--image-folder", default=None, metavar="IMGS",
        help="folder the image paths are relative to (default: the pairs file's folder)",
    )  # fmt: skip
    parser.add_argument(
        "--pairs-format", default=None, choices=["auto", "native", "rlaif-v", "rlhf-v"],
        help="record layout of --pairs (default auto)",
    )  # fmt: skip
    parser.add_argument("--out", default="runs/rm", help="output folder (default runs/rm)")
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set train.steps=50",
    )  # fmt: skip
    parser.add_argument("--no-resume", action="store_true", help="ignore and delete existing checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    from rl.pairs.importers import read_pair_file
    from rl.trainers import rm
    from rl.trainers.rm_config import RMConfig

    flags = {"model.path": args.model, "data.pairs": args.pairs, "data.image_folder": args.image_folder,
             "data.pairs_format": args.pairs_format}  # fmt: skip
    overrides = list(args.overrides) + [f"{k}={v}" for k, v in flags.items() if v is not None]
    cfg = load_config(RMConfig, args.config, overrides)
    if not cfg.model.path or not cfg.data.pairs:
        raise UserError("rl rm needs --model DIR and --pairs PAIRS.jsonl (or model.path, data.pairs)")
    if not (Path(cfg.model.path) / "config.json").is_file():
        raise UserError(f"--model {cfg.model.path}: no config.json there; pass a saved model folder")
    folder = cfg.data.image_folder or str(Path(cfg.data.pairs).parent)
    pairs, fmt = read_pair_file(cfg.data.pairs, folder, cfg.data.pairs_format)
    out = Path(args.out)
    if args.no_resume and (out / "checkpoints").exists():
        shutil.rmtree(out / "checkpoints")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    summary = rm.train(cfg, pairs, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress)
    summary = {"pairs_format": fmt, **summary}
    (out / "result.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "last"}, default=str))
    return 0
