"""``rl dpo``: DPO-family (and mDPO) post-training of a NoteVLM from its SFT checkpoint.

    rl dpo --config configs/rl/dpo_tiny.yaml --out runs/dpo --set init.model=runs/sft/model
    rl dpo --config configs/rl/dpo_tiny.yaml --set lora.enabled=true --set data.pairs=pairs.jsonl

Writes OUT/config.yaml (resolved), OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/step-*/, OUT/model
(save_pretrained + processor; LoRA merged, adapter in OUT/adapter) and OUT/result.json. Re-running with
the same OUT resumes from the last checkpoint (``--no-resume`` starts over).
"""

from __future__ import annotations

import argparse


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


def prepare_out(args: argparse.Namespace, cfg, default_root: str = "runs/rl"):
    """Resolve OUT, apply --no-resume and write OUT/config.yaml."""
    import shutil
    from pathlib import Path

    import yaml

    from mm.config import to_dict

    out = Path(args.out) if args.out else Path(default_root) / Path(args.config).stem
    if args.no_resume and (out / "checkpoints").exists():
        shutil.rmtree(out / "checkpoints")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return out


def run(args: argparse.Namespace) -> int:
    import json

    from mm.config import load_config
    from rl.trainers import dpo

    overrides = list(args.overrides) + ([f"data.folder={args.data}"] if args.data else [])
    cfg = load_config(dpo.DPOConfig, args.config, overrides)
    out = prepare_out(args, cfg)
    summary = dpo.train(cfg, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress)
    (out / "result.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "last"}, default=str))
    return 0
