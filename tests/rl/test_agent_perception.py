"""The perception stage of ``rl agent``: items built from the world's truth (crops equal to the zoom
tool's, answers equal to the scene's counts and colours, train notes only, deterministic), its config
checks, and the stage itself (weights reproducible, reading check recorded, SFTs start from it)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from mm.config import ConfigError, load_config
from mm.world.detail import padded_box
from rl.agent.answers import score_answer
from rl.agent.config import AgentRunConfig
from rl.agent.perception import PERCEPTION_VIEWS, perception_items, reading_score, zoom_crop
from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS
from rl.agent.world_demos import detail_answer, loop_observation, tray_box
from rl.agent.world_tasks import WorldTaskConfig, note_split, objects_box, photo, world_note

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"
WORLD = WorldTaskConfig(seed=0)


def _note_of(item: AgentTask):
    note_id = item.task_id.split("/")[0]  # aw<seed>-<index>
    return world_note(WORLD, int(note_id.split("-")[1]))


def test_items_answer_the_scene_truth():
    items = perception_items(WORLD, 6)
    assert {t.meta["view"] for t in items} == set(PERCEPTION_VIEWS)
    for item in items:
        note = _note_of(item)
        k = int(item.task_id.split("/")[1][1:]) - 1
        scene = note.scenes[k]
        cat, ask = item.meta["object"], item.meta["ask"]
        objs = scene.large if item.meta["view"] == "view" else scene.tiny
        same = [o for o in objs if o.category == cat]
        if ask == "count":
            assert item.answer == str(len(same)) and "How many tiny" in item.question
            assert item.meta["reply"] == detail_answer(ask, item.answer, cat, True)
        elif ask == "color":
            assert len(same) == 1 and item.answer == same[0].color and cat in item.question
            assert item.meta["reply"] == detail_answer(ask, item.answer, cat, True, same[0].size)
        else:
            assert item.meta["view"] == "target" and len(same) == 1 and cat not in item.question
            assert item.meta["reply"] == f"It is a tiny {same[0].color} {cat}."
        assert reading_score(item, item.meta["reply"]) == 1.0
        if ask != "object":
            assert score_answer(item, item.meta["reply"]) == 1.0  # scored right as a detail answer
        image = item.sources[0]
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3


def test_item_images_are_the_zoom_tools_crops_and_the_photo():
    items = perception_items(WORLD, 2)
    item = next(t for t in items if t.meta["view"] == "tray")
    note = _note_of(item)
    k = int(item.task_id.split("/")[1][1:]) - 1
    full = photo(WORLD, note, k)
    holder = AgentTask("h", "detail", (full,), "q", "a", {"tray": list(note.scenes[k].tray)})
    call = {"name": "zoom", "image": 1, "box": None}
    from rl.agent.world_demos import normalised_box

    call["box"] = normalised_box(tray_box(holder, list(note.scenes[k].tray)), 256, 256)
    _, crop = loop_observation(call, holder)  # what a tray zoom of a detail demonstration shows
    assert np.array_equal(item.sources[0], crop)
    S = WORLD.detail.source_size
    assert np.array_equal(zoom_crop(full, padded_box(note.scenes[k].tray, 2, S)), crop)
    target = next(t for t in items if t.meta["view"] == "target" and t.task_id.startswith(note.id))
    objs = [o for o in note.scenes[int(target.task_id.split("/")[1][1:]) - 1].tiny]
    objs = [o for o in objs if o.category == target.meta["object"]]
    x0, y0, x1, y1 = objects_box(WORLD, objs)
    h, w = target.sources[0].shape[:2]
    assert (x1 - x0, y1 - y0) <= (w, h) <= (x1 - x0 + 3, y1 - y0 + 3)  # outward rounding of the box
    view = next(t for t in items if t.meta["view"] == "view")
    assert view.sources[0].shape == (S, S, 3)
    assert "zoom" in TOOLS


def test_items_are_deterministic_train_only_and_views_filter():
    a, b = perception_items(WORLD, 4), perception_items(WORLD, 4)
    assert [t.task_id for t in a] == [t.task_id for t in b]
    assert all(np.array_equal(x.sources[0], y.sources[0]) for x, y in zip(a, b))
    assert len({t.task_id for t in a}) == len(a)
    notes = {t.task_id.split("/")[0] for t in a}
    assert len(notes) == 4 and all(note_split(WORLD, int(n.split("-")[1])) == "train" for n in notes)
    trays = perception_items(WORLD, 4, ["tray"])
    assert [t.task_id for t in trays] == [t.task_id for t in a if t.meta["view"] == "tray"]
    later = perception_items(WORLD, 2, start=50)
    assert all(int(t.task_id.split("/")[0].split("-")[1]) >= 50 for t in later)
    asks = Counter(t.meta["ask"] for t in a)
    assert asks["count"] > 0 and asks["color"] > 0


def test_reading_score_of_object_items():
    item = next(t for t in perception_items(WORLD, 2) if t.meta["ask"] == "object")
    color, cat = item.answer.split(" ", 1)
    other = next(c for c in ("red", "blue") if c != color)
    assert reading_score(item, f"It is a tiny {color} {cat}.") == 1.0
    assert reading_score(item, f"It is a tiny {other} {cat}.") == 0.0
    assert reading_score(item, f"It is a tiny {color} or {other} {cat}.") == 0.0  # a hedge is wrong
    assert reading_score(item, f"It is {color}.") == 0.0  # no category


def test_items_reject_bad_arguments():
    with pytest.raises(ValueError, match="views must be"):
        perception_items(WORLD, 2, ["tray", "poster"])
    with pytest.raises(ValueError, match="notes must be"):
        perception_items(WORLD, 0)


@pytest.mark.parametrize(
    "override, message",
    [
        ("perception.views=[tray,poster]", "perception.views"),
        ("perception.views=[]", "perception.views"),
        ("perception.steps=-1", "perception needs"),
        ("perception.batch_size=0", "perception needs"),
        ("perception.check_notes=-2", "check_notes"),
        ("perception.bogus=1", "bogus"),
        ("eval.split=dev", "eval.split"),
        ("eval.start=-1", "eval.start"),
    ],
)
def test_bad_perception_config_is_an_error(override, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        load_config(AgentRunConfig, TINY, [override])


def _stage_cfg(*overrides: str) -> AgentRunConfig:
    base = ["perception.steps=2", "perception.notes=2", "perception.batch_size=3", "perception.log_every=1"]
    return load_config(AgentRunConfig, TINY, [*base, *overrides])


def test_perception_stage_is_reproducible_and_checks_reading(tmp_path):
    from rl.agent.perception_stage import run_perception
    from rl.agent.stages import build_backend, save_weights

    cfg = _stage_cfg("perception.check_notes=1", "rollout.max_new_tokens=4")
    backend = build_backend(cfg)
    save_weights(backend, tmp_path / "init.pt")
    weights = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        result = run_perception(cfg, tmp_path / name, tmp_path / "init.pt")
        weights.append(torch.load(tmp_path / name / "model.pt", weights_only=True))
        assert result["steps"] == 2 and result["items"] > 0 and result["final_loss"] > 0
        check = result["reading_check"]
        assert set(check) <= {"tray/count", "tray/color", "target/count", "target/color", "target/object"}
        assert check
        for row in check.values():
            assert row["n"] >= 1 and 0.0 <= row["accuracy"] <= 1.0 and 0.0 < row["top_answer_share"] <= 1.0
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    init = torch.load(tmp_path / "init.pt", weights_only=True)
    assert any(not torch.equal(init[k], weights[0][k]) for k in init)  # it trained


def test_sft_stages_start_from_the_perception_model(tmp_path, monkeypatch):
    import rl.agent.run as run

    assert run.STAGES.index("init") < run.STAGES.index("perception") < run.STAGES.index("sft_tool")
    assert "perception" in run.TRAINING_SECTIONS
    seen = {}
    monkeypatch.setattr(run, "run_sft", lambda cfg, d, init, tools, stage: seen.setdefault(stage, init))
    cfg = load_config(AgentRunConfig, TINY)
    for stage in ("sft_tool", "sft_notool"):
        run._run_stage(cfg, tmp_path, stage, tmp_path / stage, None)
        assert seen[stage] == tmp_path / "perception" / "model.pt"


def test_perception_off_copies_the_initial_policy(tmp_path):
    from rl.agent.run import _run_stage
    from rl.agent.stages import build_backend, save_weights

    cfg = load_config(AgentRunConfig, TINY, ["perception.steps=0"])
    (tmp_path / "init").mkdir()
    (tmp_path / "perception").mkdir()
    save_weights(build_backend(cfg), tmp_path / "init/model.pt")
    result = _run_stage(cfg, tmp_path, "perception", tmp_path / "perception", None)
    assert result == {"stage": "perception", "steps": 0}
    a = torch.load(tmp_path / "init/model.pt", weights_only=True)
    b = torch.load(tmp_path / "perception/model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_eval_can_check_the_train_split_past_the_training_notes():
    from rl.agent.evaluate import heldout_tasks

    cfg = load_config(AgentRunConfig, TINY, ["eval.tasks_per_kind=2", "eval.split=train", "eval.start=300"])
    tasks = heldout_tasks(cfg, 0)
    assert len(tasks) == 2 * len(cfg.data.kinds)
    for t in tasks:
        assert (
            t.meta["note"] >= "aw0-000300" and note_split(WORLD, int(t.meta["note"].split("-")[1])) == "train"
        )
    test = heldout_tasks(load_config(AgentRunConfig, TINY, ["eval.tasks_per_kind=2"]), 0)
    assert all(t.meta["split"] == "test" for t in test)
