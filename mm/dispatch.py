"""Subcommand dispatch shared by the ``mm`` and ``rl`` command lines.

Each subcommand module exposes ``configure(parser)`` and ``run(args) -> int``. Only the chosen
module is imported, so ``--help`` and light commands never pay for torch start-up. A
:class:`~mm.errors.UserError`, :class:`~mm.config.ConfigError` or disk error (any ``OSError``: a
missing input, ``--out`` under a regular file, an unwritable folder, a full disk) becomes one line on
stderr and exit code 2. Before the command runs, a given ``--out`` is checked without creating
anything: its nearest existing ancestor must be a writable folder. SIGTERM unwinds the command as Ctrl-C
does (:mod:`mm.signals`): staged outputs are removed and worker pools stopped, exit code 143. Under a
multi-process launch a command that finished leaves the process group in step with the others
(:func:`leave_launch_group`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mm.config import ConfigError
from mm.errors import UserError, check_out_path, describe_os_error
from mm.signals import sigterm_unwinds


def build_parser(
    prog: str, description: str, commands: dict[str, tuple[str, str]], argv: list[str]
) -> argparse.ArgumentParser:
    """The top-level parser; only the subcommand named in ``argv`` gets its options added."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_) in commands.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if argv and argv[0] == name:
            importlib.import_module(module).configure(p)
    return parser


def dispatch(
    prog: str, description: str, commands: dict[str, tuple[str, str]], argv: list[str] | None = None
) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the chosen subcommand, return its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog, description, commands, argv).parse_args(argv)
    try:
        if isinstance(getattr(args, "out", None), str):
            check_out_path(args.out)
        with sigterm_unwinds():
            code = int(importlib.import_module(commands[args.command][0]).run(args) or 0)
        leave_launch_group()
        return code
    except (UserError, ConfigError) as e:
        message = str(e)
    except OSError as e:
        message = describe_os_error(e)
    print(f"{prog} {args.command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def leave_launch_group() -> None:
    """After a command that ran under ``torchrun`` / ``accelerate launch`` (a joined group of 2 or more
    processes): every process waits for the others, then leaves the group. A gloo group torn down at exit
    while a peer's last message (the broadcast of a result rank 0 wrote) is still in flight aborts the
    process ("terminate called without an active exception") after its work is done. Nothing alone, or
    when torch was never imported; a command that failed skips this and exits as it would."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return
    dist.barrier()
    dist.destroy_process_group()
