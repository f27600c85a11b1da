"""Pooling ``rl agent`` runs: rows concatenated per model give the same figures as one run over them;
a task evaluated twice or a run without eval rows is an error; the CLI writes report.md and report.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mm.errors import UserError
from rl.agent.evaluate import summarise
from rl.agent.pool import MODELS, main, pool_report


def _row(seed: int, i: int, kind: str, correct: float) -> dict:
    row = {"seed": seed, "task_id": f"aw{seed}-{i:06d}/{kind}", "kind": kind, "score": correct,
           "correct": correct, "answered": 1.0, "calls": 1, "valid_calls": 1, "turns": 2,
           "truncation": None}  # fmt: skip
    if kind == "dialogue":
        row["goal_reached"] = correct
    return row


def _run(folder: Path, seed: int, right: dict[str, int]) -> None:
    """A run folder with 4 detail and 4 dialogue rows per model of ``right``; ``right[model]`` of each kind
    correct."""
    (folder / "eval").mkdir(parents=True)
    for m in right:
        rows = [_row(seed, i, k, float(i < right[m])) for k in ("detail", "dialogue") for i in range(4)]
        (folder / "eval" / f"{m}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_pooled_figures_are_those_of_the_concatenated_rows(tmp_path):
    _run(tmp_path / "a", 0, {"notool_sft": 1, "tool_sft": 2, "tool_grpo": 3})
    _run(tmp_path / "b", 1, {"notool_sft": 0, "tool_sft": 1, "tool_grpo": 4})
    report = pool_report([tmp_path / "a", tmp_path / "b"], n_boot=50)
    assert report["seeds"] == [0, 1] and report["tasks_per_kind"] == 4
    m = report["metrics"]
    assert m["tool_grpo"]["accuracy/detail"]["value"] == pytest.approx(7 / 8)
    assert m["notool_sft"]["accuracy/detail"]["value"] == pytest.approx(1 / 8)
    assert report["gains_tool_grpo_over_notool_sft"]["accuracy/detail"]["value"] == pytest.approx(6 / 8)
    assert m["tool_grpo"]["goal_reached"]["value"] == pytest.approx(7 / 8)
    files = [tmp_path / f / "eval/tool_sft.jsonl" for f in ("a", "b")]
    rows = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    assert m["tool_sft"]["accuracy/detail"] == summarise(rows, n_boot=50)["accuracy/detail"]
    detail = next(t for t in report["targets"] if t["metric"] == "accuracy/detail")
    assert detail["held"] is True


def test_pool_refuses_a_task_twice_and_a_run_without_eval(tmp_path):
    _run(tmp_path / "a", 0, dict.fromkeys(MODELS, 1))
    with pytest.raises(UserError, match="twice"):
        pool_report([tmp_path / "a", tmp_path / "a"], n_boot=20)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no eval rows"):
        pool_report([tmp_path / "a", tmp_path / "empty"], n_boot=20)


def test_pool_cli_writes_the_report(tmp_path, capsys):
    _run(tmp_path / "a", 0, dict.fromkeys(MODELS, 2))
    assert main([str(tmp_path / "a"), "--out", str(tmp_path / "pooled"), "--n-boot", "20"]) == 0
    assert "report.md" in capsys.readouterr().out
    text = (tmp_path / "pooled/report.md").read_text()
    assert "| accuracy/detail |" in text and "## Targets" in text
    assert json.loads((tmp_path / "pooled/report.json").read_text())["runs"] == [str(tmp_path / "a")]


def test_ppo_rows_are_pooled_when_every_run_has_them(tmp_path):
    _run(tmp_path / "a", 0, {"notool_sft": 1, "tool_sft": 2, "tool_grpo": 3, "tool_ppo": 4})
    _run(tmp_path / "b", 1, {"notool_sft": 0, "tool_sft": 1, "tool_grpo": 2, "tool_ppo": 2})
    report = pool_report([tmp_path / "a", tmp_path / "b"], n_boot=20)
    assert report["metrics"]["tool_ppo"]["accuracy/detail"]["value"] == pytest.approx(6 / 8)
    assert report["gains_tool_ppo_over_tool_grpo"]["accuracy/detail"]["value"] == pytest.approx(1 / 8)
    _run(tmp_path / "c", 2, dict.fromkeys(MODELS, 1))  # a run without PPO: pooled without it
    report = pool_report([tmp_path / "a", tmp_path / "c"], n_boot=20)
    assert list(report["metrics"]) == list(MODELS) and "gains_tool_ppo_over_tool_grpo" not in report
