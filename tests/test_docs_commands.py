"""Every command the docs show is one the code takes: its subcommand and flags parse, and its config with
its ``--set`` overrides loads.

The commands are read from the ```` ```bash ```` and ```` ```console ```` blocks of the README, ``docs/`` and
``benchmarks/README.md``: each ``mm``, ``rl`` and ``imgdiff`` command (also under ``torchrun`` and
``accelerate launch``), each ``python -m`` of the project's modules and each ``python benchmarks/X.py``.
Nothing runs: the command's own argument parser parses its words (``parse_args`` is stopped right after),
then a command that takes a config loads it with its ``--set`` overrides, from its ``--config`` file of
``configs/`` or from the config class's defaults (``rl pipeline`` resolves every stage's config, nested
``*.overrides`` included, as it does before it runs; a run folder's saved config is not checked). A
shell variable takes the value the block assigns it (``W=0``, ``Q='...'``, ``for w in 0 1 2``), else 0;
a command with a ``...`` word is a sketch and only its words before ``...`` are not checked.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from tests.test_docs_examples import blocks

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
             "benchmarks/README.md")  # fmt: skip
_HEREDOC = re.compile(r"<<-?\s*'?(\w+)'?[^\n]*\n.*?^\s*\1$", re.M | re.S)
_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)
PROJECT = ("mm", "rl", "imgdiff")
CONFIG_KINDS = {
    ("mm", "pretrain"): "pretrain", ("mm", "train"): "train", ("mm", "data"): "world",
    ("mm", "compare-fusion"): "compare", ("rl", "dpo"): "dpo", ("rl", "grpo"): "grpo", ("rl", "ppo"): "ppo",
    ("rl", "rm"): "rm", ("rl", "distill"): "distill", ("rl", "agent"): "agent",
    ("rl", "pipeline"): "pipeline",
}  # fmt: skip
"""(program, subcommand) -> the config kind its ``--config`` file is (``mm.config_kinds``)."""


def segments(line: str) -> list[str]:
    """The simple commands of one shell line: split at unquoted ``;``, ``&&``, ``||``, ``|``, ``&`` and
    redirections (whose targets become segments of their own), an unquoted ``#`` ending the line."""
    out, cur, quote, i = [], "", None, 0
    while i < len(line):
        c = line[i]
        if quote:
            quote = None if c == quote else quote
            cur += c
        elif c in "'\"":
            quote, cur = c, cur + c
        elif c == "\\" and i + 1 < len(line):
            cur, i = cur + line[i : i + 2], i + 1
        elif c == "#" and (not cur or cur[-1].isspace()):
            break
        elif c in ";&|<>()":
            out.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    return [s.strip() for s in [*out, cur] if s.strip()]


def commands(text: str) -> list[list[str]]:
    """The words of every simple command in the shell blocks of a Markdown text, variables substituted."""
    found = []
    for kind, body in blocks(text):
        if kind not in ("bash", "console"):
            continue
        env: dict[str, str] = {}
        body = _HEREDOC.sub("", body).replace("\\\n", " ")
        for line in body.splitlines():
            line = line.strip()
            if kind == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            for seg in segments(line):
                try:
                    words = shlex.split(expand(seg, env))
                except ValueError:
                    continue
                while words and words[0] in ("do", "then", "else", "time"):
                    words = words[1:]
                if len(words) >= 3 and words[0] == "for" and words[2] == "in":
                    env[words[1]] = words[3] if len(words) > 3 else "0"
                    continue
                while words and (m := _ASSIGN.match(words[0])):
                    env[m.group(1)] = m.group(2)
                    words = words[1:]
                if words:
                    found.append(optional_dropped(words))
    return found


def expand(seg: str, env: dict[str, str]) -> str:
    """``seg`` with each ``$NAME`` / ``${NAME}`` outside single quotes replaced by its value in ``env`` (0
    when unset): inside double quotes as one word, unquoted split into words, as the shell does."""
    out, quote, i = "", None, 0
    while i < len(seg):
        c = seg[i]
        m = _VAR.match(seg, i) if c == "$" and quote != "'" else None
        if m:
            value = env.get(m.group(1) or m.group(2), "0")
            out += value.replace("\\", "\\\\").replace('"', '\\"') if quote == '"' else value
            i = m.end()
            continue
        if c in "'\"" and quote in (None, c):
            quote = None if quote else c
        out += c
        i += 1
    return out


def optional_dropped(words: list[str]) -> list[str]:
    """``words`` without the usage-style optional groups a doc may show (``[--threshold 0.3]``)."""
    out, depth = [], 0
    for w in words:
        if depth == 0 and w.startswith("[-"):
            depth = 1
        if depth == 0:
            out.append(w)
        elif w.endswith("]"):
            depth = 0
    return out


def target(words: list[str]) -> tuple[str, str, list[str]] | None:
    """("main" | "module" | "script", name, argv) of a project command, else None."""
    w = words
    if w[0] == "torchrun" or w[:2] == ["accelerate", "launch"]:
        if "-m" not in w:
            return None
        i = w.index("-m")
        w = ["python", "-m", *w[i + 1 :]]
    if w[0] in PROJECT:
        return "main", w[0], w[1:]
    if w[0] in ("python", "python3") and len(w) > 2 and w[1] == "-m" and w[2].split(".")[0] in PROJECT:
        return ("main", w[2], w[3:]) if w[2] in PROJECT else ("module", w[2], w[3:])
    script = w[1] if w[0] in ("python", "python3") and len(w) > 1 else ""
    if script.startswith("benchmarks/") and script.endswith(".py"):
        return "script", script, w[2:]
    return None


def documented() -> list[tuple[str, str, str, list[str]]]:
    """(document, kind, name, argv) of every project command the docs show."""
    out = []
    for doc in DOCUMENTS:
        for words in commands((ROOT / doc).read_text()):
            t = target(words)
            if t is not None:
                out.append((doc, *t))
    return out


class _Parsed(Exception):
    """Raised by the patched ``parse_args`` once the words parsed: nothing of the command runs."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


@contextlib.contextmanager
def _stop_after_parsing():
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = parse


def parse(kind: str, name: str, argv: list[str]) -> argparse.Namespace:
    """The namespace the command's own parser makes of ``argv``; a parse error raises ``AssertionError``
    with argparse's message."""
    err, argv0 = io.StringIO(), sys.argv
    try:
        quiet = contextlib.redirect_stdout(io.StringIO())
        with _stop_after_parsing(), contextlib.redirect_stderr(err), quiet:
            if name == "imgdiff":  # the CLI reads the plain two-path form without argparse
                from imgdiff.cli import build_parser

                build_parser().parse_args(argv)
                code = 0
            elif kind == "main":
                code = importlib.import_module(f"{name}.cli").main(argv)
            else:
                sys.argv = [name, *argv]
                if kind == "module":
                    runpy.run_module(name, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(str(ROOT / name), run_name="__main__")
                code = 0
    except _Parsed as done:
        return done.namespace
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv0
    raise AssertionError(f"exit {code} before its words parsed: {err.getvalue().strip()}")


def check_config(name: str, ns: argparse.Namespace) -> None:
    """Load the config a command takes (its ``--config`` file, else the defaults) with its overrides."""
    from mm.config import load_config
    from mm.config_kinds import config_class

    kind = CONFIG_KINDS.get((name, getattr(ns, "command", None)))
    path = getattr(ns, "config", None)
    if kind is None or (path is not None and not (isinstance(path, str) and path.startswith("configs/"))):
        return  # a run folder's config (OUT/config.yaml, a stage's saved YAML) is not in the repository
    if kind == "dpo" and getattr(ns, "pairs", None):
        kind = "dpo_files"
    if kind == "grpo" and getattr(ns, "prompts", None):
        kind = "grpo_files"
    overrides = list(getattr(ns, "overrides", None) or [])
    cfg = load_config(config_class(kind), None if path is None else ROOT / path, overrides)
    if kind == "pipeline":
        from rl.pipeline import resolve

        with _in_root():
            resolve(cfg, Path("runs") / "docs-check")


@contextlib.contextmanager
def _in_root():
    import os

    before = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(before)


def test_segments_and_commands_read_shell_as_a_shell_does():
    assert segments("a 'x;y' && b | c > out.txt # note") == ["a 'x;y'", "b", "c", "out.txt"]
    text = "```bash\nW=1; Q='k=[a,b]'\nfor s in 4 5; do\n  rl x --seed $s --out r$W \\\n"
    text += '    "$Q"\ndone\n```\n'
    assert commands(text) == [["rl", "x", "--seed", "4", "--out", "r1", "k=[a,b]"], ["done"]]
    text = "```bash\nS='a=1 b=\"2 3\"'\nrl x $S \"$S\" '$S' [--threshold 0.3] [--json]\n```\n"
    assert commands(text) == [["rl", "x", "a=1", "b=2 3", 'a=1 b="2 3"', "$S"]]
    fence = "```console\n$ imgdiff a b\ndifferent\n```\n```bash\ncat > f <<'EOF'\nrl no\nEOF\n```\n"
    assert commands(fence) == [["imgdiff", "a", "b"], ["cat"], ["f"]]  # a redirection target stands alone
    assert target(["torchrun", "--nproc_per_node", "2", "-m", "rl", "dpo"]) == ("main", "rl", ["dpo"])
    assert target(["python", "-m", "rl.labeler_eval", "--x"]) == ("module", "rl.labeler_eval", ["--x"])
    assert target(["python", "benchmarks/b.py", "p"]) == ("script", "benchmarks/b.py", ["p"])
    assert target(["python", "-m", "venv", ".venv"]) is None and target(["pip", "install"]) is None


def test_a_wrong_flag_or_config_key_fails_the_check():
    with pytest.raises(AssertionError, match="unrecognized arguments: --no-such-flag"):
        parse("main", "rl", ["dpo", "--config", "configs/rl/dpo.yaml", "--no-such-flag"])
    ns = parse("main", "rl", ["grpo", "--config", "configs/rl/grpo.yaml", "--set", "algo.no_such_key=1"])
    with pytest.raises(Exception, match="no_such_key"):
        check_config("rl", ns)
    ns = parse("main", "rl", ["pipeline", "--config", "configs/rl/pipeline.yaml", "--out", "runs/x", "--set",
                              "dpo.overrides=[train.no_such_key=1]"])  # fmt: skip
    with pytest.raises(Exception, match="no_such_key"):
        check_config("rl", ns)


CASES = documented()


@pytest.mark.slow
def test_the_docs_show_many_commands():
    assert len(CASES) > 200 and {doc for doc, *_ in CASES} >= {"README.md", "docs/results.md"}


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "kind", "name", "argv"), CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
def test_documented_command_parses_and_its_config_loads(doc, kind, name, argv):
    if "..." in argv:
        argv = argv[: argv.index("...")]
        with contextlib.suppress(AssertionError):  # a sketch: its words up to "..." only
            parse(kind, name, argv)
        return
    ns = parse(kind, name, argv)
    check_config(name, ns)
