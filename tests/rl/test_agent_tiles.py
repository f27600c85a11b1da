"""The ``tiles`` tool (``rl.agent.tiles``, off unless in ``tool_modules``): the grid cuts the box exactly,
every tile comes after its label in the policy's ids, the world's tile demonstrations say what each tile
holds, and ``rl agent`` runs with it end to end; without the module nothing changes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mm.config import ConfigError, load_config
from rl.agent.config import AgentRunConfig
from rl.agent.parse import ParseError, parse_call
from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS, Observation, tile_bounds
from tests.rl.agent_helpers import run_tool_module, tool_module, tray_detail_tasks

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"


@pytest.fixture
def tiles_tool(monkeypatch):
    """``rl.agent.tiles`` imported (its tool registered); the loop's registry restored afterwards."""
    yield from tool_module(monkeypatch, "rl.agent.tiles")


def _task(*sources: np.ndarray, meta: dict | None = None) -> AgentTask:
    return AgentTask("t/detail", "detail", sources, "q?", "a", meta or {})


def test_tiles_is_off_until_its_module_is_imported(tiles_tool):
    assert "tiles" in TOOLS
    tiles_tool.register()  # registering again leaves the registry as it is
    assert TOOLS.names.count("tiles") == 1


def test_the_registry_is_restored_after_the_fixture():
    assert "tiles" not in TOOLS  # no other test sees the tool


@pytest.mark.parametrize(
    "x0, x1, n, spans",
    [
        (0, 9, 3, [(0, 3), (3, 6), (6, 9)]),
        (10, 20, 3, [(10, 13), (13, 17), (17, 20)]),
        (5, 7, 3, [(5, 6), (6, 7), (6, 7)]),  # shorter than n: a pixel repeats, none empty
        (0, 76, 4, [(0, 19), (19, 38), (38, 57), (57, 76)]),
    ],
)
def test_tile_bounds(x0, x1, n, spans):
    assert tile_bounds(x0, x1, n) == spans


def test_tiles_cut_the_full_resolution_crop_row_by_row(tiles_tool):
    src = np.arange(40 * 60 * 3, dtype=np.int64).reshape(40, 60, 3).astype(np.uint8)
    task = _task(np.zeros((8, 8, 3), np.uint8), src)
    call = parse_call('<tool>{"name": "tiles", "image": 2, "box": [0.5, 0.25, 1.0, 1.0], "grid": 3}</tool>',
                      TOOLS, n_images=2)  # fmt: skip
    obs = TOOLS.run(call, task)
    assert obs.text == "tiles of image 2 at [0.50, 0.25, 1.00, 1.00], 3 x 3, row by row:"
    assert obs.labels == tuple(f" tile {k}:" for k in range(1, 10))
    crop = src[10:40, 30:60]
    rows = [np.concatenate(obs.images[3 * r : 3 * r + 3], axis=1) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate(rows, axis=0), crop)  # the tiles are the crop, exactly


@pytest.mark.parametrize(
    "args, reason",
    [
        ('"image": 1, "box": [0, 0, 1, 1], "grid": 1', "bad_value"),
        ('"image": 1, "box": [0, 0, 1, 1], "grid": 5', "bad_value"),
        ('"image": 1, "box": [0, 0, 1, 1]', "missing_arg"),
        ('"image": 1, "box": [0.5, 0, 0.2, 1], "grid": 2', "bad_box"),
        ('"image": 3, "box": [0, 0, 1, 1], "grid": 2', "image_out_of_range"),
    ],
)
def test_bad_tiles_calls_are_errors(tiles_tool, args, reason):
    out = parse_call('<tool>{"name": "tiles", ' + args + "}</tool>", TOOLS, n_images=2)
    assert isinstance(out, ParseError) and out.reason == reason, out


def test_an_observation_needs_one_label_per_image():
    im = np.zeros((2, 2, 3), np.uint8)
    with pytest.raises(ValueError, match="one per image"):
        Observation("x", im, (im,), (" a:",))


def test_labels_come_before_their_images_in_the_ids(tiles_tool):
    from rl.agent.backend import OBS_CLOSE, OBS_OPEN
    from rl.agent.stages import build_backend

    backend = build_backend(
        load_config(AgentRunConfig, TINY, ["policy.overrides=[max_images=16,max_length=1024]"])
    )
    ims = [np.full((8, 8, 3), v, np.uint8) for v in (0, 100)]
    seg = backend.observation("look:", ims, (" tile 1:", " tile 2:"))
    image = backend.image_segment(ims[0]).ids
    expect = [*backend.text_ids(OBS_OPEN + "look:"), *backend.text_ids(" tile 1:"), *image,
              *backend.text_ids(" tile 2:"), *image, *backend.text_ids(OBS_CLOSE)]  # fmt: skip
    assert seg.ids == expect and len(seg.images) == 2
    assert backend.observation("look:", ims).ids == [
        *backend.text_ids(OBS_OPEN + "look:"), *image, *image, *backend.text_ids(OBS_CLOSE)
    ]  # fmt: skip


@pytest.mark.parametrize("zoom", ["tiles", "photo_tiles"])
def test_tile_demonstrations_say_what_each_tile_holds(tiles_tool, zoom):
    from rl.agent.scoring import first_aim
    from rl.agent.tools import box_pixels
    from rl.agent.world_demos import answer_turns, demonstration, policy_turns

    for task in tray_detail_tasks(12):
        turns = demonstration(task, detail_zoom=zoom, bare_answers=True)
        assert [t.role for t in turns] == [
            "user",
            *["assistant", "tool"] * (1 + (zoom == "photo_tiles")),
            "assistant",
        ]
        if zoom == "photo_tiles":  # the whole photo's tiles, then the one holding the tray is named
            whole, found = turns[1].call, turns[3]
            assert whole == {
                "name": "tiles",
                "image": task.meta["image"],
                "box": [0.0, 0.0, 1.0, 1.0],
                "grid": 3,
            }
            k = int(found.text.split("The tray is in tile ")[1].split(".")[0])
            assert found.text.endswith("</tool>") and found.call["box"] == turns[-3].call["box"]
            S = task.sources[0].shape[0]
            c0, r0, c1, r1 = [
                round(v * S / 3) for v in ((k - 1) % 3, (k - 1) // 3, (k - 1) % 3 + 1, (k - 1) // 3 + 1)
            ]
            x0, y0, x1, y1 = task.meta["tray"]
            assert c0 <= x0 and x1 <= c1 and r0 <= y0 and y1 <= r1  # the tray lies in tile k (3 x 3 spots)
        call, tool, answer = turns[-3], turns[-2], turns[-1]
        assert call.call["name"] == "tiles" and call.call["grid"] == 3 and tool.role == "tool"
        a0, b0, a1, b1 = box_pixels(call.call["box"], S := task.sources[0].shape[1], S)
        x0, y0, x1, y1 = task.meta["tray"]
        assert a0 <= x0 and b0 <= y0 and x1 <= a1 and y1 <= b1  # the tiles cover the whole tray
        inventory, value = answer.text.split(" <answer>")
        entries = inventory.split(". ")
        assert len(entries) == 9 and entries[0].startswith("tile 1: ")
        held = Counter(e.split(": ")[1].rstrip(".").split()[-1] for e in entries)
        truth = Counter(cat for cat, *_ in task.meta["tiny"])
        assert {k: v for k, v in held.items() if k != "empty"} == truth  # every tiny object, once
        if task.meta["ask"] == "count":
            assert held[task.meta["object"]] == int(task.answer)
        assert value == f"{answer.plain}</answer>" and answer_turns(turns) == [answer.plain]
        assert policy_turns(turns)[-1] == answer.text
    # the first aiming call is judged as a zoom is (tiles of the whole photo are passed over, as its zoom)
    from rl.agent.demos import scripted_policy
    from rl.agent.loop import LoopConfig, rollout
    from rl.agent.stages import build_backend

    backend = build_backend(
        load_config(AgentRunConfig, TINY, ["policy.overrides=[max_images=24,max_length=1024]"])
    )
    tasks = tray_detail_tasks(2)
    demos = {t.task_id: policy_turns(demonstration(t, detail_zoom=zoom, bare_answers=True)) for t in tasks}
    trajs = rollout(backend, tasks, LoopConfig(max_new_tokens=256, max_tokens=512),
                    policy=scripted_policy(backend, demos))  # fmt: skip
    assert [first_aim(t) for t in trajs] == ["on_target", "on_target"]
    per_call = 9 * (1 + (zoom == "photo_tiles"))
    assert all(
        len(t.images) == len(t.task.sources) + per_call and t.n_valid_calls == per_call // 9 for t in trajs
    )


def test_tiles_demonstrations_need_the_module_and_room_for_the_tiles(tiles_tool, tmp_path):
    with pytest.raises(ConfigError, match=r"tool_modules=\[rl.agent.tiles\]"):
        load_config(AgentRunConfig, TINY, ["data.detail_zoom=tiles"])
    from rl.agent.stages import build_backend, demo_trajectories

    sets = ["data.detail_zoom=tiles", "tool_modules=[rl.agent.tiles]"]
    cfg = load_config(AgentRunConfig, TINY, sets)  # the call is longer than a 64-token turn
    with pytest.warns(UserWarning, match="2 of 2 demonstrations are cut: a turn longer than rollout.max_new"):
        demo_trajectories(build_backend(cfg), cfg, tray_detail_tasks(2), tools=True)
    cfg = load_config(AgentRunConfig, TINY, [*sets, "rollout.max_new_tokens=128", "rollout.max_tokens=256"])
    with pytest.warns(
        UserWarning, match="2 demonstrations are cut: images beyond max_images"
    ):  # 8: photos + 9
        demo_trajectories(build_backend(cfg), cfg, tray_detail_tasks(2), tools=True)
    sets = ["data.detail_zoom=photo_tiles", "tool_modules=[rl.agent.tiles]", "rollout.max_new_tokens=192",
            "rollout.max_tokens=512", "policy.overrides=[max_images=24,max_length=1024]",
            "rollout.max_length=500"]  # fmt: skip
    cfg = load_config(AgentRunConfig, TINY, sets)  # 18 tiles and a photo: 19 x 18 image ids and the text
    with pytest.warns(UserWarning, match="are cut: longer than rollout.max_length"):
        demo_trajectories(build_backend(cfg), cfg, tray_detail_tasks(2), tools=True)


def test_cli_runs_with_tiles(tiles_tool, tmp_path):
    from rl.agent.loop import instructions

    sets = ["data.detail_zoom=tiles", "tool_modules=[rl.agent.tiles]",
            "policy.overrides=[max_images=16,max_length=1024]", "rollout.max_new_tokens=128",
            "rollout.max_tokens=256"]  # fmt: skip
    _, detail = run_tool_module(tmp_path, TINY, sets)
    assert "tiles(image, box, grid)" in instructions(TOOLS)  # the policy is told of it
    assert {t.calls[0].call.name for t in detail} == {"tiles"}
