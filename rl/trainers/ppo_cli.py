"""``rl ppo``: PPO with a critic (a value head on the policy, or a separate critic) on the world's notes.

    rl ppo --config configs/rl/ppo_tiny.yaml --out runs/ppo --set init.model=runs/sft/model
    rl ppo --config configs/rl/ppo.yaml --set critic=separate kl.mode=loss algo.beta=0.04 algo.kl_estimator=k3

Writes OUT/config.yaml (resolved), OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/step-*/, OUT/model
(the policy with its processor; LoRA merged), OUT/value_head.pt + OUT/value_head.json (and OUT/critic/model
for ``critic: separate``) and OUT/result.json. Re-running with the same OUT resumes from the last checkpoint
(``--no-resume`` starts over). Under torchrun / accelerate launch each process samples its share of the
prompts and N processes take one process's steps (:mod:`rl.trainers.ppo_shard`); rank 0 writes.
"""

from __future__ import annotations

import argparse

from mm.config import load_config
from rl.trainers import ppo
from rl.trainers.dpo_cli import prepare_out, write_result


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML file: rl.trainers.ppo_config.PPOConfig")
    parser.add_argument("--out", default=None, help="output folder (default runs/rl/<config name>)")
    parser.add_argument("--data", default=None, help="note folder to use instead of the config's data.folder")
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set critic=separate ppo.epochs=4 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--no-resume", action="store_true", help="ignore and delete existing checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    overrides = list(args.overrides) + ([f"data.folder={args.data}"] if args.data else [])
    cfg = load_config(ppo.PPOConfig, args.config, overrides)
    out, main = prepare_out(args, cfg)
    summary = ppo.train(cfg, out_dir=out, resume=not args.no_resume, show_progress=not args.no_progress)
    if main:
        write_result(out, summary)
    return 0
