"""Load a script of ``benchmarks/`` as a module (the benchmarks are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
"""The benchmarks folder."""


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module; the folder goes on ``sys.path`` first, since several scripts
    import ``rl_bench`` from beside them."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
