"""``rl.agent.read_probe``: mention recall (golden values), the same-theme control, a CLI smoke run."""

from __future__ import annotations

import json
import math

import pytest

from rl.agent.read_probe import main, mention_recall, same_theme_other
from tests.rl.agent_helpers import tiny_notevlm


def test_mention_recall_golden():
    objects = [[("car", "red"), ("cup", "blue")], [("dog", "white")]]
    captions = ["It shows a red car and a green cup.", "A photo from a park."]
    assert mention_recall(objects, captions) == {"objects": 3, "name": 2 / 3, "colour_name": 1 / 3}
    empty = mention_recall([[]], ["anything"])
    assert empty["objects"] == 0 and math.isnan(empty["name"])
    with pytest.raises(ValueError, match="one caption per photo: 2 photos, 1 captions"):
        mention_recall(objects, captions[:1])


def test_same_theme_other_is_the_next_photo_of_its_theme():
    assert same_theme_other(["park", "desk", "park", "bath", "desk", "park"]) == [2, 4, 5, 3, 1, 0]


def test_cli_on_a_tiny_model(tmp_path, capsys):
    adapter = tiny_notevlm()
    adapter.model.save_pretrained(str(tmp_path / "m"))
    adapter.processor.save_pretrained(tmp_path / "m")
    assert main([str(tmp_path / "m"), "--notes", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["photos"] == 3 and out["seed"] == 0 and len(out["examples"]) == 3
    for key in ("large/photo", "tiny/photo", "tiny/tray"):
        for row in (out[key], out[key + "/control"]):
            assert row["objects"] >= 3 and 0.0 <= row["name"] <= 1.0 and 0.0 <= row["colour_name"] <= 1.0
