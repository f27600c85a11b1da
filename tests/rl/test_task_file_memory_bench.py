"""benchmarks/task_file_memory.py at a tiny size: every way of reading runs and reports the same pixels."""

from __future__ import annotations

from tests.helpers.bench import load_benchmark


def test_the_three_reads_run_and_see_the_same_decoded_size(capsys):
    out = load_benchmark("task_file_memory").main(
        ["--photos", "3", "--size", "120x90", "--max-side", "64", "--runs", "1"]
    )
    assert list(out) == ["in RAM, full-size JPEG decode", "in RAM", "cache, cold", "cache, warm"]
    assert len({r["decoded_mb"] for r in out.values()}) == 1 and out["in RAM"]["decoded_mb"] > 0
    assert "| cache, warm |" in capsys.readouterr().out
