"""benchmarks/find_naming.py at a tiny size: both ways of naming run and give every region the same name."""

from __future__ import annotations

import pytest

from tests.helpers.bench import load_benchmark
from tests.rl.agent_helpers import tool_module


@pytest.fixture
def find_tool(monkeypatch):
    """``rl.agent.find`` imported afresh for the benchmark (its registration undone afterwards)."""
    yield from tool_module(monkeypatch, "rl.agent.find")


def test_per_call_and_prepare_name_every_region_alike(find_tool, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = load_benchmark("find_naming").main(["--tasks", "3", "--runs", "1", "--batch", "8"])
    assert out["same_names"] and out["regions"] > 0 and out["photos"] >= 3
    assert "prepare / per call" in capsys.readouterr().out
