import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "world_speed.py"


def test_world_speed_benchmark_runs_tiny(capsys):
    spec = importlib.util.spec_from_file_location("world_speed", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--notes", "4", "--cli-notes", "3", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    for row in ("generate", "png ours", "png cv2 (before)", "json", "files", "mm data world --notes 3"):
        assert row in out
