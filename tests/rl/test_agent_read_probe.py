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


def test_detail_reading_asks_the_question_on_the_right_tray_zoom():
    from rl.agent.read_probe import answer_right, detail_question, detail_reading
    from rl.agent.world_tasks import WorldTaskConfig, world_tasks

    cfg = WorldTaskConfig(seed=0)
    tasks = list(world_tasks(cfg, "detail", "test", 12))
    for t in tasks:
        q = detail_question(t)
        if t.meta["ask"] == "color":
            assert q == f"What colour is the {t.meta['object']} in this photo?"
            assert answer_right(t, f"{t.answer}") and not answer_right(t, "zebra-coloured")
        else:
            assert q.startswith("How many ") and q.endswith(" are in this photo?")
            assert answer_right(t, t.answer) and not answer_right(t, str(int(t.answer) + 1))

    class Echo:  # answers every question with the true answer of the task it came from
        def __init__(self):
            self.answers = iter(t.answer for t in tasks)

        def prompt(self, images, text):
            return text

        def generate(self, rows, max_new_tokens, sampling):
            return [type("Turn", (), {"text": next(self.answers)})() for _ in rows]

    out = detail_reading(Echo(), cfg, 12, batch_size=5)
    asks = [t.meta["ask"] for t in tasks]
    for ask in ("color", "count"):
        assert out[ask]["tasks"] == out[ask]["right"] == asks.count(ask)
        assert 1 <= out[ask]["constant"] <= out[ask]["tasks"] or out[ask]["tasks"] == 0
    assert out["tasks"] == 12


def test_detail_cli_on_a_tiny_model(tmp_path, capsys):
    adapter = tiny_notevlm()
    adapter.model.save_pretrained(str(tmp_path / "m"))
    adapter.processor.save_pretrained(tmp_path / "m")
    assert main([str(tmp_path / "m"), "--notes", "4", "--detail", "--tray-spots", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"] == 4 and out["color"]["tasks"] + out["count"]["tasks"] == 4


def test_cli_world_settings_reach_the_tasks_and_bad_keys_are_refused(tmp_path, capsys, monkeypatch):
    import rl.agent.read_probe as rp

    adapter = tiny_notevlm()
    adapter.model.save_pretrained(str(tmp_path / "m"))
    adapter.processor.save_pretrained(tmp_path / "m")
    seen = {}
    monkeypatch.setattr(rp, "detail_reading", lambda backend, cfg, n: seen.setdefault("cfg", cfg) and {})
    sets = ["detail.tiny_radius_min=6", "detail.tiny_radius_max=9"]
    assert main([str(tmp_path / "m"), "--seed", "2", "--detail", "--tray-spots", "3", "--set", *sets]) == 0
    cfg, detail = seen["cfg"], seen["cfg"].detail
    assert (cfg.seed, detail.tray_spots, detail.tiny_radius_min, detail.tiny_radius_max) == (2, 3, 6, 9)
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "m"), "--set", "detail.bogus=1"])
    assert info.value.code == 2 and "unknown key 'detail.bogus'" in capsys.readouterr().err


def test_objects_cli_on_a_tiny_model(tmp_path, capsys, monkeypatch):
    import sys

    from rl.agent.tools import TOOLS

    monkeypatch.setattr(TOOLS, "_tools", dict(TOOLS._tools))  # importing rl.agent.objects registers its tool
    monkeypatch.delitem(sys.modules, "rl.agent.objects", raising=False)
    adapter = tiny_notevlm()
    adapter.model.save_pretrained(str(tmp_path / "m"))
    adapter.processor.save_pretrained(tmp_path / "m")
    assert main([str(tmp_path / "m"), "--notes", "4", "--objects", "--tray-spots", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    # the tool cuts out exactly the tray's tiny objects, and every one of them on the whole photo
    assert out["tasks"] == 4 and out["trays_exact"] == 4 and out["photo"]["tiny_missed"] == 0
    assert out["cutouts"] >= 12 and sum(out["photo"]["other_regions"].values()) == 4
    assert 0.0 <= out["colour_and_category"] <= out["category"] <= 1.0


@pytest.fixture
def find_tool(monkeypatch):
    """``rl.agent.find`` imported afresh (its tool registered, no namer); the registry restored afterwards."""
    from tests.rl.agent_helpers import tool_module

    yield from tool_module(monkeypatch, "rl.agent.find")


class Oracle:
    """A backend whose caption of an image is ``truth[image bytes]``."""

    def __init__(self, truth: dict[bytes, str]):
        self.truth = truth

    def prompt(self, images, text):
        return self.truth[images[0].tobytes()]

    def generate(self, rows, max_new_tokens, sampling):
        return [type("Turn", (), {"text": row})() for row in rows]


def _tiny_model(tmp_path):
    adapter = tiny_notevlm()
    adapter.model.save_pretrained(str(tmp_path / "m"))
    adapter.processor.save_pretrained(tmp_path / "m")
    return str(tmp_path / "m")


def test_find_reading_with_an_oracle_namer_answers_every_question(find_tool):
    from mm.config import load_config
    from rl.agent.read_probe import find_reading
    from rl.agent.world_demos import find_call
    from rl.agent.world_tasks import WorldTaskConfig, world_tasks

    tool = find_tool
    cfg = load_config(WorldTaskConfig, None, ["seed=0", "detail.tray_spots=3"])
    truth = {}  # each cut-out described as the tiny object inside its region, if any
    for t in world_tasks(cfg, "detail", "test", 12):
        for f, crop in tool.regions(t, find_call(t)["image"]):
            inside = [
                o for o in t.meta["tiny"] if f.box[0] <= o[2] < f.box[2] and f.box[1] <= o[3] < f.box[3]
            ]
            truth[crop.tobytes()] = f"It is a tiny {inside[0][1]} {inside[0][0]}." if inside else "A stroke."

    out = find_reading(Oracle(truth), cfg, 12, batch_size=5)
    assert out["color"]["tasks"] + out["count"]["tasks"] == 12 and out["regions"] >= 36
    assert out["color"]["right"] == out["color"]["tasks"] and out["count"]["right"] == out["count"]["tasks"]
    assert tool._namer is None  # the probe's namer is not left behind


def test_find_cli_on_a_tiny_model(tmp_path, capsys, find_tool):
    assert main([_tiny_model(tmp_path), "--notes", "3", "--find", "--tray-spots", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    asks = [k for k in ("color", "count") if k in out]
    assert sum(out[k]["tasks"] for k in asks) == 3 and all(
        0 <= out[k]["right"] <= out[k]["tasks"] for k in asks
    )


def test_tally_reading_with_an_oracle_namer_gets_every_tray(find_tool):
    from mm.config import load_config
    from rl.agent.read_probe import tally_reading
    from rl.agent.world_tasks import WorldTaskConfig, world_note, world_tasks

    tool = find_tool
    cfg = load_config(WorldTaskConfig, None, ["seed=0", "detail.tray_spots=3"])
    truth, trays = {}, 0  # each cut-out described as the tiny object inside its region, if any
    for t in world_tasks(cfg, "caption", "test", 6):
        scene = world_note(cfg, int(t.meta["note"].rsplit("-", 1)[1])).scenes[t.meta["photo"] - 1]
        for f, crop in tool.regions(t, 1):
            inside = [o for o in scene.tiny if f.box[0] <= o.cx < f.box[2] and f.box[1] <= o.cy < f.box[3]]
            truth[crop.tobytes()] = (
                f"It is a tiny {inside[0].color} {inside[0].category}." if inside else "A tray."
            )
        trays += 1

    out = tally_reading(Oracle(truth), cfg, 6, batch_size=5)
    assert out["tasks"] == trays == 6 and out["objects"] >= 18
    assert out["recall"] == out["precision"] == out["trays_right"] == 1.0
    assert out["counts_right"] in (None, 1.0) and tool._namer is None


def test_tally_cli_on_a_tiny_model(tmp_path, capsys, find_tool):
    assert main([_tiny_model(tmp_path), "--notes", "2", "--tally", "--tray-spots", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"] == 2 and out["objects"] >= 2 and 0 <= out["found"] <= out["objects"]
