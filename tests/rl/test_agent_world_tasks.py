"""World tasks: deterministic per seed, held-out notes, change pairs that differ only in the changed
box, and score_answer on right, wrong and partial answers of every kind."""

from __future__ import annotations

import numpy as np
import pytest

import imgdiff
from mm.world.change import CHANGE_KINDS
from rl.agent.answers import caption_units, score_answer
from rl.agent.task import AgentTask
from rl.agent.world_tasks import WorldTaskConfig, mixed_tasks, note_split, world_task, world_tasks

CFG = WorldTaskConfig(seed=0)


def _task(kind: str, **meta) -> AgentTask:
    img = np.zeros((8, 8, 3), np.uint8)
    return AgentTask(f"t/{kind}", kind, (img,), "q", meta.pop("answer", ""), meta)


def test_tasks_are_deterministic_per_seed():
    for kind in ("detail", "change", "caption", "dialogue"):
        a, b = world_task(CFG, kind, 5), world_task(CFG, kind, 5)
        assert (a.question, a.answer, a.meta) == (b.question, b.answer, b.meta)
        assert all(np.array_equal(x, y) for x, y in zip(a.sources, b.sources, strict=True))
        c = world_task(WorldTaskConfig(seed=1), kind, 5)
        assert not np.array_equal(a.sources[0], c.sources[0])


def test_train_and_test_never_share_notes():
    train = [t.meta["note"] for t in world_tasks(CFG, "detail", "train", 40)]
    test = [t.meta["note"] for t in world_tasks(CFG, "caption", "test", 12)]
    assert len(set(train)) == 40 and len(set(test)) == 12
    assert not set(train) & set(test)
    # every kind of one note lands in the note's split
    index = int(test[0].split("-")[1])
    assert note_split(CFG, index) == "test"
    assert {world_task(CFG, k, index).meta["split"] for k in ("detail", "change", "dialogue")} == {"test"}
    share = np.mean([note_split(CFG, i) == "test" for i in range(400)])
    assert 0.12 < share < 0.28  # test_fraction 0.2


def test_change_pairs_differ_only_in_the_changed_box():
    kinds = set()
    for i in range(24):
        t = world_task(CFG, "change", i)
        kinds.add(t.meta["change"])
        before, after = t.sources
        x0, y0, x1, y1 = t.meta["box"]
        outside = np.ones(before.shape[:2], bool)
        outside[y0:y1, x0:x1] = False
        changed = (before != after).any(-1)
        assert changed.any() and not changed[outside].any()
        r = imgdiff.diff(before, after)
        assert r.bbox is not None
        assert x0 <= r.bbox[0] and r.bbox[2] < x1 and y0 <= r.bbox[1] and r.bbox[3] < y1
    assert kinds == set(CHANGE_KINDS)


def test_detail_tasks_ask_colours_and_counts_with_a_zoom_box():
    tasks = list(world_tasks(CFG, "detail", "train", 20))
    assert {t.meta["ask"] for t in tasks} == {"color", "count"}
    for t in tasks:
        img = t.sources[t.meta["image"] - 1]
        x0, y0, x1, y1 = t.meta["box"]
        assert 0 <= x0 < x1 <= img.shape[1] and 0 <= y0 < y1 <= img.shape[0]
        assert x1 - x0 <= CFG.detail.tray_size + 12  # a zoom, not the whole photo
        assert img.shape == (CFG.detail.source_size,) * 2 + (3,)


def test_reference_answers_score_one():
    for kind in ("detail", "change", "caption", "dialogue"):
        for t in world_tasks(CFG, kind, "train", 8):
            assert score_answer(t, t.answer) == pytest.approx(1.0), (kind, t.answer)


def test_detail_scores():
    color = _task("detail", ask="color", answer="red", object="cup")
    assert score_answer(color, "The tiny cup is red.") == 1.0
    assert score_answer(color, "It is blue.") == 0.0
    assert score_answer(color, "red or blue") == 0.5
    assert score_answer(color, "I can't tell.") == 0.0
    assert score_answer(color, '<tool>{"name": "zoom"}</tool> red') == 1.0
    assert score_answer(color, "<answer>green</answer> but maybe red") == 0.0
    color = _task("detail", ask="color", answer="red", object="cup")
    assert score_answer(color, "The tiny cup is red.") == 1.0
    assert score_answer(color, "The tiny fork is red.") == 0.0
    count = _task("detail", ask="count", answer="2", object="cup")
    assert score_answer(count, "There are two tiny cups.") == 1.0
    assert score_answer(count, "There are 2.") == 1.0
    assert score_answer(count, "Three.") == 0.0
    assert score_answer(count, "two or three") == 0.5
    assert score_answer(count, "In photo 3 there are 2 tiny cups, in box [1, 5, 9, 9].") == 1.0
    assert score_answer(count, "Image two shows three cups.") == 0.0


def test_change_scores():
    t = _task("change", change="recoloured", object="cup", color="red", new_color="blue")
    assert score_answer(t, "The tiny cup was recoloured from red to blue.") == pytest.approx(1.0)
    assert score_answer(t, "The cup changed colour to blue.") == pytest.approx(0.9)  # half the colours
    assert score_answer(t, "The tiny fork was removed.") == pytest.approx(0.0)
    assert score_answer(t, "The tiny cup was moved.") == pytest.approx(0.4)
    assert score_answer(t, "The tiny cup has a new colour: blue, it was red.") == pytest.approx(1.0)
    t = _task("change", change="added", object="shell", color="green", new_color=None)
    assert score_answer(t, "A tiny green shell was added.") == pytest.approx(1.0)
    assert score_answer(t, "A tiny green crab was added.") == pytest.approx(0.6)
    assert score_answer(t, "A new shell or crab appeared.") == pytest.approx(0.6)


def test_caption_scores_count_and_attribute_hallucinations():
    t = _task("caption", objects=[[("cup", "red"), ("cup", "blue"), ("fork", "green")]])
    right = "Two tiny cups (red and blue) and a green fork."
    assert score_answer(t, right) == pytest.approx(1.0)
    wrong_count = "Three tiny cups (red and blue) and a green fork."
    wrong_color = "Two tiny cups (red and blue) and a purple fork."
    partial = "A green fork."
    phantom = "Two tiny cups (red and blue), a green fork and a knife."
    units = caption_units(t, wrong_count)
    assert units["count"]["hallucinated"] == 1 and units["attribute"]["hallucinated"] == 0
    assert caption_units(t, wrong_color)["attribute"]["hallucinated"] == 1
    for text in (wrong_count, wrong_color, partial, phantom):
        assert 0.0 < score_answer(t, text) < 1.0, text
    assert score_answer(t, "") == 0.0
    assert score_answer(t, partial) < score_answer(t, wrong_color)


def test_dialogue_scores():
    t = _task("dialogue", goal={"object": "shell", "count": 3, "colors": ["green", "red"]})
    assert score_answer(t, "There are 3 tiny shells (green and red).") == 1.0
    assert score_answer(t, "There are 3 tiny shells, all red.") == pytest.approx(0.75)
    assert score_answer(t, "Two blue shells.") == 0.0
    assert score_answer(t, "There are 3 tiny crabs (green and red).") == 0.0


def test_mixed_tasks_cycle_kinds_over_distinct_notes():
    tasks = list(mixed_tasks(CFG, "test", 8))
    assert [t.kind for t in tasks] == ["detail", "change", "dialogue", "caption"] * 2
    assert len({t.meta["note"] for t in tasks}) == 8 and {t.meta["split"] for t in tasks} == {"test"}
    with pytest.raises(ValueError, match="kinds"):
        next(mixed_tasks(CFG, "train", 1, kinds=("riddle",)))


def test_bad_inputs_say_what_to_fix():
    with pytest.raises(ValueError, match="split"):
        next(world_tasks(CFG, "detail", "val", 1))
    with pytest.raises(ValueError, match="kind"):
        world_task(CFG, "riddle", 0)
    with pytest.raises(ValueError, match="test_fraction"):
        WorldTaskConfig(test_fraction=0.0)
