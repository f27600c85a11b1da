"""Every field of every dataclass in mm/train and rl/trainers has a docstring on the line after it (PEP 257
attribute docstrings), which `mm config show` reads with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*(ROOT / "mm" / "train").rglob("*.py"), *(ROOT / "rl" / "trainers").rglob("*.py")])


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Name) and target.id == "dataclass") or (
            isinstance(target, ast.Attribute) and target.attr == "dataclass"
        ):
            return True
    return False


def undocumented_fields(path: Path) -> list[str]:
    """``Class.field`` of each dataclass field in ``path`` without a string literal right after it."""
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.ClassDef) and _is_dataclass(node)):
            continue
        body = node.body
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            nxt = body[i + 1] if i + 1 < len(body) else None
            documented = (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            )
            if not documented:
                missing.append(f"{node.name}.{stmt.target.id} (line {stmt.lineno})")
    return missing


def test_the_files_hold_config_dataclasses():
    names = {n.name for p in FILES for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)}
    assert {
        "OptimConfig",
        "RunConfig",
        "BatchRunConfig",
        "PretrainConfig",
        "TrainConfig",
        "DPOConfig",
    } <= names
    assert "GRPOConfig" in names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dataclass_field_has_a_docstring(path):
    assert undocumented_fields(path) == []


def test_the_checker_catches_a_missing_docstring(tmp_path):
    bad = tmp_path / "bad.py"
    lines = ["from dataclasses import dataclass", "@dataclass(kw_only=True)", "class A:", "    x: int = 1"]
    lines += ['    """Documented."""', "    y: int = 2", "    z: int = 3", '    """Documented."""']
    bad.write_text("\n".join(lines) + "\n")
    assert undocumented_fields(bad) == ["A.y (line 6)"]
