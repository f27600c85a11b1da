"""benchmarks/gpu_check_agent.py on the CPU: the device check's every step runs and every check holds."""

from __future__ import annotations

import json

from tests.helpers.bench import load_benchmark


def test_the_agent_device_check_passes_on_the_cpu(capsys):
    assert load_benchmark("gpu_check_agent").main(["--device", "cpu"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["device"] == "cpu" and all(line["checks"].values()) and len(line["checks"]) == 6
