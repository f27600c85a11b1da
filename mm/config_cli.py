"""``mm config show``: a config's resolved fields (defaults, file, overrides), each with its doc.

    mm config show configs/mm/sft.yaml
    mm config show configs/rl/grpo.yaml --set rollout.temperature=1.0 algo.beta=0.04
    mm config show --kind dpo                  # every field at its default
    mm config kinds                            # the kinds and the command that takes each

The kind (which dataclass the file is) comes from ``--kind`` or is guessed from the file name or its
top-level keys (the first output line says which); see :mod:`mm.config_kinds`.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser(
        "show", help="print a config's resolved fields with their docs", description=__doc__.split("\n")[0]
    )
    s.add_argument("file", nargs="?", default=None, help="YAML config file (omit with --kind: the defaults)")
    s.add_argument(
        "--kind", default=None, help="config kind (default: guessed); `mm config kinds` lists them"
    )
    s.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set train.steps=50 optim.lr=1e-3 (repeatable)",
    )  # fmt: skip
    sub.add_parser("kinds", help="list the config kinds, their classes and commands")


def _value(v: Any) -> str:
    """A value as it would be written in YAML or after ``--set key=``."""
    import yaml

    if isinstance(v, tuple):
        v = list(v)
    text = yaml.safe_dump(v, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def render(cfg: Any, *, width: int = 100) -> str:
    """Every leaf field of ``cfg`` as ``key: value`` and its doc indented below."""
    from mm.config_docs import described

    lines = []
    for key, value, doc in described(cfg):
        lines.append(f"{key}: {_value(value)}")
        text = " ".join(doc.split()) or "(no doc)"
        lines += textwrap.wrap(text, width=width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def show(file: str | None, kind: str | None, overrides: list[str]) -> str:
    """The text ``mm config show`` prints."""
    import yaml

    from mm.config import ConfigError, load_config
    from mm.config_kinds import KINDS, config_class, guess_kind, kind_name
    from mm.errors import UserError

    if file is None and kind is None:
        raise UserError("give a config FILE, or --kind KIND to see a kind's defaults (`mm config kinds`)")
    if file is not None and not Path(file).is_file():
        raise UserError(f"config file {file} does not exist")
    if kind is not None:
        name, how = kind_name(kind), "given with --kind"
    else:
        data = yaml.safe_load(Path(file).read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{file}: top level must be a mapping, got {type(data).__name__}")
        name, how = guess_kind(file, data)
    cls = config_class(name)
    cfg = load_config(cls, file, overrides)
    what = file if file is not None else "defaults"
    head = f"# {what}: {cls.__module__}.{cls.__qualname__}, kind {name} ({how})"
    return f"{head}\n# taken by: {KINDS[name].command}\n{render(cfg)}"


def kinds_table() -> str:
    """One line per kind: name, class, command."""
    from mm.config_kinds import ALIASES, KINDS

    rows = [f"{name:<9} {k.target.replace(':', '.'):<36} {k.command}" for name, k in KINDS.items()]
    aliases = ", ".join(f"{a} = {k}" for a, k in ALIASES.items())
    return "\n".join([*rows, f"aliases: {aliases}"])


def _print(text: str) -> None:
    """Print ``text``; a reader that stops early (``mm config show FILE | head``) is not an error."""
    import os
    import sys

    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit


def run(args: argparse.Namespace) -> int:
    _print(kinds_table() if args.action == "kinds" else show(args.file, args.kind, args.overrides))
    return 0
