"""The zoom-aim breakdown of a run's eval rows: golden counts per photo count and on / off target, a clear
stop on rows that predate the fields, and the CLI on a folder laid out as ``rl agent`` leaves it."""

from __future__ import annotations

import json

import pytest

from tests.helpers.bench import load_benchmark


@pytest.fixture(scope="module")
def za():
    return load_benchmark("zoom_aim")


def _row(kind="detail", photos=1, aim=1.0, correct=1.0):
    return {"kind": kind, "photos": photos, "zoom_on_target": aim, "correct": correct}


def test_aim_table_counts_on_target_by_photos_and_accuracy_by_aim(za):
    rows = [
        _row(photos=1, aim=1.0, correct=1.0), _row(photos=1, aim=0.0, correct=0.0),
        _row(photos=3, aim=1.0, correct=0.0), _row(photos=3, aim=0.0, correct=1.0),
        _row(photos=3, aim=0.0, correct=0.0),
    ]  # fmt: skip
    t = za.aim_table(rows)
    assert t["tasks"] == 5
    assert t["on_target_by_photos"] == {1: [1.0, 2.0], 3: [1.0, 3.0]}
    assert t["accuracy"] == {"on_target": [1.0, 2.0], "off_target": [1.0, 3.0]}


def test_aim_table_splits_the_misses_when_rows_say_where_the_zoom_went(za):
    rows = [
        {**_row(photos=2, aim=1.0), "aim": "on_target"}, {**_row(photos=2, aim=0.0), "aim": "other_photo"},
        {**_row(photos=2, aim=0.0), "aim": "other_photo"}, {**_row(photos=1, aim=0.0), "aim": "other_place"},
    ]  # fmt: skip
    t = za.aim_table(rows)
    assert t["aim_by_photos"] == {
        1: {"on_target": 0, "other_place": 1, "other_photo": 0, "other_thing": 0, "no_zoom": 0},
        2: {"on_target": 1, "other_place": 0, "other_photo": 2, "other_thing": 0, "no_zoom": 0},
    }
    assert "aim_by_photos" not in za.aim_table([*rows, _row()])  # a row from before the field


def test_cli_pools_runs_and_stops_on_old_rows(za, tmp_path, capsys):
    for i, run in enumerate(("a", "b")):
        (tmp_path / run / "eval").mkdir(parents=True)
        rows = [_row(photos=2, aim=float(i), correct=1.0), _row(kind="change", photos=2, aim=0.0)]
        (tmp_path / run / "eval" / "tool_grpo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert za.main([str(tmp_path / "a"), str(tmp_path / "b"), "--models", "tool_grpo"]) == 0
    out = capsys.readouterr().out.splitlines()
    want = "tool_grpo: first zoom on target: 2 photo(s) 1/2; on target 1/1 right, off target 1/1 right"
    assert out[0] == want
    assert json.loads(out[1])["tool_grpo"]["tasks"] == 2
    (tmp_path / "a" / "eval" / "tool_grpo.jsonl").write_text(json.dumps({"kind": "detail", "correct": 1.0}))
    with pytest.raises(SystemExit, match="predates zoom_on_target"):
        za.main([str(tmp_path / "a"), "--models", "tool_grpo"])
    with pytest.raises(SystemExit, match="is missing"):
        za.main([str(tmp_path / "a"), "--models", "tool_sft"])
