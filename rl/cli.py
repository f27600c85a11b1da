"""``rl`` command line: thin dispatch to one module per subcommand.

Each subcommand module exposes ``configure(parser)`` and ``run(args) -> int``. Only the chosen
module is imported, so ``rl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mm.config import ConfigError
from mm.errors import UserError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "dpo": ("rl.trainers.dpo_cli", "DPO-family post-training of a NoteVLM from its SFT checkpoint"),
    "grpo": ("rl.trainers.grpo_cli", "GRPO/DAPO post-training of a NoteVLM with hallucination rewards"),
    "pairs": ("rl.pairs_cli", "build preference pairs (object injection, on-policy, image-corrupted)"),
    "pipeline": ("rl.pipeline", "the main job: data -> pretrain -> align -> SFT -> eval -> DPO/GRPO -> eval"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rl",
        description="notelens post-training against hallucination: DPO, GRPO and the full pipeline.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if argv and argv[0] == name:
            importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except (UserError, ConfigError, FileNotFoundError) as e:
        print(f"rl {args.command}: error: {e}", file=sys.stderr)
        return 2
