"""The shown output in the docs is what the commands print today.

Each ```` ```console ```` block of the documents below is a shell session: a line ``$ CMD`` runs ``CMD``,
and the lines after it, up to the next ``$`` line, are its expected standard output, to the character (a
last line ``...`` stands for the rest). Every ```` ```bash ```` block that writes a file with a
``<<'EOF'`` here-document sets up the files the sessions after it read. The documents run in order in
one temporary folder that holds ``assets/``, with the virtual environment's commands first on ``PATH``,
so the README's quick starts are checked exactly as a user types them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/evals.md")
"""The documents whose sessions run, in this order (docs/evals.md reads the README's files)."""
_BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```$", re.M | re.S)


def blocks(text: str) -> list[tuple[str, str]]:
    """Each fenced block of a Markdown text as (language, body), in order."""
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(text)]


def session(body: str) -> list[tuple[str, list[str]]]:
    """A console block's (command, expected output lines) pairs."""
    out: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
        else:
            raise ValueError(f"a console block must open with a '$ ' line, got {line!r}")
    return out


def matches(expected: list[str], printed: str) -> bool:
    """Whether ``printed`` is ``expected`` line for line (a last line ``...``: the rest is left out)."""
    got = printed.splitlines()
    if expected and expected[-1] == "...":
        return got[: len(expected) - 1] == expected[:-1] and len(got) >= len(expected) - 1
    return got == expected


def test_session_and_matches_read_a_block_as_documented():
    assert session("$ a\n1\n2\n$ b\n") == [("a", ["1", "2"]), ("b", [])]
    assert matches(["x", "..."], "x\ny\nz\n") and not matches(["x", "..."], "w\n")
    assert matches(["x"], "x\n") and not matches(["x"], "x\ny\n")
    fenced = "text\n```console\n$ ls\n```\n```bash\necho\n```\n"
    assert blocks(fenced) == [("console", "$ ls\n"), ("bash", "echo\n")]
    with pytest.raises(ValueError, match="must open"):
        session("output first\n$ cmd\n")


def _run(script: str, cwd: Path, env: dict[str, str], status: int) -> subprocess.CompletedProcess:
    # ``(exit N)`` first: ``$?`` in the script is the previous command's status, as in one shell
    return subprocess.run(
        ["bash", "-c", f"(exit {status}); {script}"], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_documented_sessions_print_what_the_docs_show(tmp_path):
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    ran, status = 0, 0
    for doc in DOCUMENTS:
        for language, body in blocks((ROOT / doc).read_text()):
            if language == "bash" and "<<'EOF'" in body:
                proc = _run(body, tmp_path, env, 0)
                assert proc.returncode == 0, f"{doc}: a set-up block failed:\n{body}\n{proc.stderr}"
            elif language == "console":
                for command, expected in session(body):
                    proc = _run(command, tmp_path, env, status)
                    status, ran = proc.returncode, ran + 1
                    assert matches(expected, proc.stdout), (
                        f"{doc}: `{command}` printed\n{proc.stdout}\nbut the document shows\n"
                        + "\n".join(expected) + f"\n(stderr: {proc.stderr})"
                    )  # fmt: skip
    assert ran >= 12  # the README's two quick starts and docs/evals.md's samples
