"""The layout rules, checked from the source with ``ast`` (nothing is imported).

- no import cycle among the project's modules (function-level imports count: a cycle hidden inside a
  function is still a cycle);
- ``mm`` never imports ``rl``; ``imgdiff`` imports neither, nor torch;
- no package file over 600 lines;
- packages and command-line modules import nothing heavy (checked in a fresh interpreter);
- no development history (private paths, run folders, numbered sessions or issues) in tracked files
  outside ``tests/``.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mm", "rl", "imgdiff")
MAX_LINES = 600

# Each pattern is written so that it does not match itself.
HISTORY = {
    "a private path": re.compile(r"/w[o]rk/"),
    "a temporary path": re.compile(r"/t[m]p/[a-z]"),
    "a session number": re.compile(r"\bs[e]ssion[ -]?\d+", re.IGNORECASE),
    "an issue number": re.compile(r"\bi[s]sue \d+", re.IGNORECASE),
    "a run folder": re.compile(r"\bruns/p\d\d"),
}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_names(path: Path, module: str) -> set[str]:
    """Every name ``path`` imports, top-level or inside functions: ``a.b`` for ``import a.b`` and for
    ``from a import b`` both ``a`` and ``a.b`` (``b`` may be a module or a name)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, with the packages Python initialises on the way
    (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``, except the importer's own packages)."""
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        if path.name == "__init__.py":
            own.add(name)
        edges = set()
        for target in imported_names(path, name):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix not in own:
                    edges.add(prefix)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_cycles_finds_a_cycle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imported_names_see_function_level_and_relative_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\nfrom .x import y\n\ndef f():\n    from mm.world import vocab\n")
    want = {"os", "rl.pairs.x", "rl.pairs.x.y", "mm.world", "mm.world.vocab"}
    assert imported_names(path, "rl.pairs.m") == want


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (move the function to the module that owns it):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_mm_never_imports_rl():
    bad = sorted(
        f"{name} imports {', '.join(sorted(t for t in targets if t.split('.')[0] == 'rl'))}"
        for name, targets in import_graph().items()
        if name.split(".")[0] == "mm" and any(t.split(".")[0] == "rl" for t in targets)
    )
    assert not bad, "mm must not import rl (rl builds on mm):\n" + "\n".join(bad)


def test_imgdiff_imports_no_mm_rl_or_torch():
    bad = []
    for name, path in module_files().items():
        if name.split(".")[0] != "imgdiff":
            continue
        heads = {t.split(".")[0] for t in imported_names(path, name)}
        bad += [f"{name} imports {h}" for h in sorted(heads & {"mm", "rl", "torch"})]
    assert not bad, "imgdiff stands alone (no torch, no mm/rl):\n" + "\n".join(bad)


def test_no_package_file_over_600_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in module_files().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines (split them by job): {long}"


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    names = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    return [ROOT / n for n in names if n and not n.startswith("tests/") and (ROOT / n).is_file()]


def test_no_development_history_in_tracked_files():
    hits = []
    for path in tracked_files():
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            hits += [
                f"{path.relative_to(ROOT)}:{i}: {what}: {line.strip()[:80]}"
                for what, pattern in HISTORY.items()
                if pattern.search(line)
            ]
    shown = "\n".join(hits[:60])
    assert not hits, f"{len(hits)} history mentions (figures belong in docs/results.md):\n{shown}"


def loaded_after(statement: str, watch: tuple[str, ...]) -> list[str]:
    """Which of ``watch`` a fresh interpreter has imported after running ``statement``."""
    code = f"import sys\n{statement}\nprint(' '.join(m for m in {watch!r} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return run.stdout.split()


def test_packages_and_command_lines_import_nothing_heavy():
    light = "import mm, rl, imgdiff, mm.cli, rl.cli, mm.eval.cli, mm.data.cli, rl.pairs, rl.pairs.cli"
    assert loaded_after(light, ("torch", "transformers", "open_clip", "torchvision", "matplotlib")) == []


def test_model_code_leaves_optional_heavy_libraries_lazy():
    models = "import mm.model.factory, mm.eval.runners, rl.pairs.logps, rl.pairs.onpolicy, rl.report"
    assert loaded_after(models, ("open_clip", "peft", "matplotlib")) == []
