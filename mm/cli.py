"""``mm`` command line: thin dispatch to one module per subcommand.

Each subcommand module exposes ``configure(parser)`` and ``run(args) -> int``. Only the chosen
module is imported, so ``mm eval pope --questions ...`` never pays for torch start-up.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mm.config import ConfigError
from mm.errors import UserError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("mm.data.cli", "generate the synthetic note world or convert COCO/LLaVA/POPE files"),
    "pretrain": ("mm.train.pretrain_cli", "InfoNCE pretraining of vision tower + fusion + text encoder"),
    "train": ("mm.train.train_cli", "align / SFT a NoteVLM (full or LoRA)"),
    "compare-fusion": ("mm.train.compare_cli", "train the three fusion kinds at equal budget, write a table"),
    "eval": ("mm.eval.cli", "POPE / CHAIR / retrieval on files or on a model"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mm",
        description="notelens multimodal: data, pretraining, NoteVLM training and hallucination evals.",
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
        print(f"mm {args.command}: error: {e}", file=sys.stderr)
        return 2
