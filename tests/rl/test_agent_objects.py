"""The ``objects`` tool (``rl.agent.objects``, off unless in ``tool_modules``): the regions it finds to the
pixel, in reading order, on a noisy flat background; cut-outs that are squares in the image; the world's
object demonstrations name every tiny object of the tray once; ``rl agent`` runs with it end to end."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mm.config import ConfigError, load_config
from rl.agent.config import AgentRunConfig
from rl.agent.parse import parse_call
from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS, Observation
from tests.rl.agent_helpers import run_tool_module, tool_module, tray_detail_tasks

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"


@pytest.fixture
def objects_tool(monkeypatch):
    """``rl.agent.objects`` imported (its tool registered); the loop's registry restored afterwards."""
    yield from tool_module(monkeypatch, "rl.agent.objects")


def _scene(noise: int = 0, seed: int = 0) -> np.ndarray:
    """A 60 x 80 grey surface (a darker frame 3 px wide) holding three objects, a speck and one object cut
    by the right edge."""
    img = np.full((60, 80, 3), 130, np.uint8)
    img[:3], img[-3:], img[:, :3] = 60, 60, 60  # a frame of another surface: it touches the edge
    img[10:16, 40:48] = (220, 30, 30)  # row 1, right: 8 x 6
    img[12:17, 8:13] = (30, 30, 220)  # row 1, left (centre 2 px lower: the same row)
    img[30:40, 20:30] = (240, 240, 240)  # row 2: 10 x 10, white
    img[33:37, 23:27] = (20, 20, 20)  # a black part inside it: still one object
    img[50, 50] = (0, 0, 0)  # a speck: 1 px
    img[40:45, 76:80] = (0, 200, 0)  # cut by the edge
    if noise:
        rng = np.random.default_rng(seed)
        img = np.clip(img.astype(int) + rng.integers(-noise, noise + 1, img.shape), 0, 255).astype(np.uint8)
    return img


def _task(*sources: np.ndarray, meta: dict | None = None) -> AgentTask:
    return AgentTask("t/detail", "detail", sources, "q?", "a", meta or {})


def test_objects_is_off_until_its_module_is_imported(objects_tool):
    assert "objects" in TOOLS
    objects_tool.register()  # registering again leaves the registry as it is
    assert TOOLS.names.count("objects") == 1


def test_the_registry_is_restored_after_the_fixture():
    assert "objects" not in TOOLS  # no other test sees the tool


@pytest.mark.parametrize("noise", [0, 8])
def test_objects_are_found_to_the_pixel_in_reading_order(objects_tool, noise):
    found = objects_tool.find_objects(_scene(noise))
    assert [f.box for f in found] == [(8, 12, 13, 17), (40, 10, 48, 16), (20, 30, 30, 40)]
    assert [f.pixels for f in found] == [25, 48, 100]
    moved = objects_tool.find_objects(_scene(noise), offset=(100, 7))
    assert [f.box for f in moved] == [(108, 19, 113, 24), (140, 17, 148, 23), (120, 37, 130, 47)]


def test_the_largest_objects_are_kept_when_there_are_too_many(objects_tool):
    img = np.full((40, 200, 3), 120, np.uint8)
    for k in range(12):  # 12 squares, sides 3..14 px, left to right in one row
        img[12 : 12 + k + 3, 5 + 16 * k : 5 + 16 * k + k + 3] = 250
    found = objects_tool.find_objects(img)
    assert len(found) == objects_tool.MAX_OBJECTS == 10
    assert [f.box[2] - f.box[0] for f in found] == list(range(5, 15))  # the ten largest, left to right
    # 3 x 3 = 9 px is below MIN_PIXELS, 4 x 4 = 16 is not: with at most 100 px, sides 4..10 are left
    small = objects_tool.find_objects(img, max_pixels=100)
    assert [f.box[2] - f.box[0] for f in small] == [4, 5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize(
    "box, size, cut",
    [
        ((40, 40, 50, 46), (100, 100), (34, 32, 56, 54)),  # the longer side + 2 x 6, around the centre
        ((0, 0, 4, 4), (100, 100), (0, 0, 16, 16)),  # moved inside at the top left
        ((95, 2, 100, 9), (100, 100), (81, 0, 100, 19)),  # and at the right
        ((0, 0, 30, 8), (20, 20), (0, 0, 20, 20)),  # never larger than the image
    ],
)
def test_a_cutout_is_a_padded_square_inside_the_image(objects_tool, box, size, cut):
    assert objects_tool.cutout_box(box, *size) == cut


def test_the_tool_shows_each_object_after_its_label(objects_tool):
    img = _scene(noise=8)
    task = _task(np.zeros((10, 10, 3), np.uint8), img)
    whole = '<tool>{"name": "objects", "image": 2, "box": [0.0, 0.0, 1.0, 1.0]}</tool>'
    obs = TOOLS.run(parse_call(whole, TOOLS, n_images=2), task)
    assert isinstance(obs, Observation)
    assert obs.text == "3 objects in image 2 at [0.00, 0.00, 1.00, 1.00], in reading order:"
    assert obs.labels == (" object 1:", " object 2:", " object 3:")
    x0, y0, x1, y1 = objects_tool.cutout_box((20, 30, 30, 40), 80, 60)
    np.testing.assert_array_equal(obs.images[2], img[y0:y1, x0:x1])  # the full-resolution pixels
    assert [im.shape for im in obs.images] == [(17, 17, 3), (20, 20, 3), (22, 22, 3)]
    small = '<tool>{"name": "objects", "image": 2, "max_size": 0.009}</tool>'  # whole image, <= 43.2 px
    obs = TOOLS.run(parse_call(small, TOOLS, n_images=2), task)
    assert obs.text == "1 object in image 2 at [0.00, 0.00, 1.00, 1.00], in reading order:"
    assert obs.labels == (" object 1:",) and obs.images[0].shape == (17, 17, 3)  # the 25-px one
    for bad in ('"max_size": 1.5', '"box": [0.5, 0.0, 0.2, 1.0]'):
        call = parse_call(f'<tool>{{"name": "objects", "image": 2, {bad}}}</tool>', TOOLS, n_images=2)
        assert call.reason in ("bad_value", "bad_box")
    empty = '<tool>{"name": "objects", "image": 2, "box": [0.0, 0.7, 0.3, 1.0]}</tool>'
    assert TOOLS.run(parse_call(empty, TOOLS, n_images=2), task) == Observation(
        "no objects in image 2 at [0.00, 0.70, 0.30, 1.00]"
    )


@pytest.mark.parametrize("zoom", ["objects", "photo_objects"])
def test_object_demonstrations_name_every_tiny_object_once(objects_tool, zoom):
    from rl.agent.world_demos import SMALL_OBJECTS, answer_turns, demonstration, policy_turns

    for task in tray_detail_tasks(24):
        turns = demonstration(task, detail_zoom=zoom, bare_answers=True)
        assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant"]
        call, answer = turns[1].call, turns[-1]
        assert call["name"] == "objects" and call["image"] == task.meta["image"]
        if zoom == "photo_objects":  # the whole photo, small objects only: no box
            assert call == {"name": "objects", "image": task.meta["image"], "max_size": SMALL_OBJECTS}
        inventory, value = answer.text.split(" <answer>")
        entries = inventory.split(". ")
        assert [e.split(":")[0] for e in entries] == [f"object {k}" for k in range(1, len(entries) + 1)]
        named = Counter(tuple(e.rstrip(".").split()[-2:]) for e in entries if "something else" not in e)
        assert named == Counter((colour, cat) for cat, colour, *_ in task.meta["tiny"])
        if task.meta["ask"] == "count":
            assert sum(n for (_, cat), n in named.items() if cat == task.meta["object"]) == int(task.answer)
        assert value == f"{answer.plain}</answer>" and answer_turns(turns) == [answer.plain]
        assert policy_turns(turns)[-1] == answer.text


def test_object_demonstrations_need_the_module(objects_tool):
    with pytest.raises(ConfigError, match=r"tool_modules=\[rl.agent.objects\]"):
        load_config(AgentRunConfig, TINY, ["data.detail_zoom=objects"])


def test_cli_runs_with_objects(objects_tool, tmp_path):
    from rl.agent.loop import instructions

    sets = ["data.detail_zoom=objects", "tool_modules=[rl.agent.objects]",
            "policy.overrides=[max_images=12,max_length=1024]", "rollout.max_new_tokens=128",
            "rollout.max_tokens=256"]  # fmt: skip
    _, detail = run_tool_module(tmp_path, TINY, sets)
    assert "objects(image, box, max_size)" in instructions(TOOLS)  # the policy is told of it
    assert {t.calls[0].call.name for t in detail} == {"objects"}
    # each object's cut-out is one more image of the trajectory, as the tool returned it
    assert all(len(t.images) == len(t.task.sources) + len(t.task.meta["tiny"]) for t in detail)


def test_task_export_brings_the_tool_its_demonstrations_call(objects_tool, tmp_path, capsys):
    from rl.agent.task_export import main

    sys.modules.pop("rl.agent.objects")  # as in a fresh process: neither the module nor its tool
    del TOOLS._tools["objects"]  # (the fixture's copy of the registry)
    assert main(["--out", str(tmp_path), "--tasks", "2", "--zoom", "photo_objects"]) == 0
    assert "objects" in TOOLS and "2 tasks" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [[call["name"] for call in r["demo"]] for r in rows] == [["objects"], ["objects"]]
