"""Demonstrations: well-formed turns (policy flag on assistant turns only, one tool call per tool turn,
observations right after), zoom crops from the sources, answers that score 1, dialogues that satisfy."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from rl.agent.answers import score_answer
from rl.agent.parse import ToolCall
from rl.agent.simulator import UserSimulator
from rl.agent.tools import TOOLS, box_pixels
from rl.agent.world_demos import (
    answer_turns,
    demonstration,
    listed_regions,
    normalised_box,
    policy_turns,
    unlearned,
)
from rl.agent.world_tasks import WorldTaskConfig, world_task

CFG = WorldTaskConfig(seed=0)
TOOL = re.compile(r"<tool>(.*?)</tool>", re.S)


@pytest.mark.parametrize("bare", [False, True])
@pytest.mark.parametrize("kind", ["detail", "change", "caption", "dialogue"])
def test_demonstrations_are_well_formed_and_right(kind, bare):
    for index in range(4):
        task = world_task(CFG, kind, index)
        turns = demonstration(task, bare_answers=bare)
        assert turns[0].role == "user" and turns[0].text
        assert all(t.policy == (t.role == "assistant") for t in turns)
        tools = 0
        for i, t in enumerate(turns):
            calls = TOOL.findall(t.text) if t.role == "assistant" else []
            if calls:
                assert len(calls) == 1 and json.loads(calls[0]) == t.call
                nxt = turns[i + 1]
                assert nxt.role == "tool" and nxt.call == t.call and not nxt.policy
                tools += 1
                if t.call["name"] == "zoom":
                    src = task.sources[t.call["image"] - 1]
                    assert all(0.0 <= v <= 1.0 for v in t.call["box"])  # normalised, as the parser wants
                    x0, y0, x1, y1 = box_pixels(t.call["box"], src.shape[1], src.shape[0])
                    assert np.array_equal(nxt.image, src[y0:y1, x0:x1])
                    args = {"image": t.call["image"], "box": t.call["box"]}
                    assert nxt.text == TOOLS.run(ToolCall("zoom", args), task).text
            if t.role == "tool":
                assert turns[i - 1].role == "assistant" and turns[i - 1].call == t.call
        assert tools >= 1
        finals = [t for t in turns if t.role == "assistant" and t.call is None]
        if kind == "dialogue":
            sim = UserSimulator(task, seed=0)
            for t in finals:
                sim.reply(t.text)
            assert sim.satisfied
            assert turns[-1].role == "user"
        else:
            assert turns[-1] is finals[-1] and len(finals) == 1
            assert score_answer(task, finals[-1].text) == pytest.approx(1.0)


def test_change_demo_compares_then_zooms_where_the_object_is():
    task = world_task(CFG, "change", 1)
    calls = [t.call for t in demonstration(task) if t.role == "assistant" and t.call]
    assert calls[0] == {"name": "compare", "images": [1, 2]}
    assert all(c["name"] == "zoom" for c in calls[1:])
    assert len(calls) - 1 == sum(task.meta[k] is not None for k in ("before_box", "after_box"))


def test_run_tool_replaces_observations():
    task = world_task(CFG, "detail", 0)
    turns = demonstration(task, run_tool=lambda call, t: (f"seen {call['name']}", None))
    obs = [t for t in turns if t.role == "tool"]
    assert [t.text for t in obs] == ["seen zoom"] and obs[0].image is None


def test_turns_serialise_to_json():
    task = world_task(CFG, "detail", 2)
    rows = [t.to_json() for t in demonstration(task)]
    assert json.loads(json.dumps(rows)) == rows
    assert [r["role"] for r in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[2]["image_shape"][2] == 3 and rows[1]["policy"] and not rows[2]["policy"]


def test_normalised_box_covers_the_pixel_box():
    assert normalised_box([90, 20, 166, 96], 256, 256) == [0.35, 0.07, 0.65, 0.38]
    for box in ([0, 0, 256, 256], [3, 250, 7, 256], [127, 1, 129, 2]):
        x0, y0, x1, y1 = box_pixels(normalised_box(box, 256, 256), 256, 256)
        assert x0 <= box[0] and y0 <= box[1] and x1 >= box[2] and y1 >= box[3]
        assert x1 - x0 <= box[2] - box[0] + 6 and y1 - y0 <= box[3] - box[1] + 6


def test_observations_are_the_loops_and_turn_lists():
    task = world_task(CFG, "change", 1)
    turns = demonstration(task)
    obs = [t for t in turns if t.role == "tool"]
    assert obs[0].text == TOOLS.run(ToolCall("compare", {"images": [1, 2]}), task).text
    assert obs[0].text.startswith("1 region changed") or "regions changed" in obs[0].text
    assert policy_turns(turns)[0] == '<tool>{"name": "compare", "images": [1, 2]}</tool>'
    assert answer_turns(turns) == [policy_turns(turns)[-1]] and "<tool>" not in answer_turns(turns)[0]


def test_detail_demo_can_zoom_on_the_tray():
    task = world_task(CFG, "detail", 0)
    (call,) = [t.call for t in demonstration(task, detail_zoom="tray") if t.role == "assistant" and t.call]
    src = task.sources[call["image"] - 1]
    x0, y0, x1, y1 = box_pixels(call["box"], src.shape[1], src.shape[0])
    tx0, ty0, tx1, ty1 = task.meta["tray"]
    assert x0 <= tx0 and y0 <= ty0 and x1 >= tx1 and y1 >= ty1  # the whole tray, a few pixels more
    assert (x1 - x0) - (tx1 - tx0) <= 8
    bx0, by0, bx1, by1 = task.meta["box"]  # the asked objects lie on it (their padded box may stick out)
    assert x0 <= (bx0 + bx1) / 2 <= x1 and y0 <= (by0 + by1) / 2 <= y1
    with pytest.raises(ValueError, match="detail_zoom"):
        demonstration(task, detail_zoom="nowhere")


def test_detail_demo_can_look_at_the_asked_photo_before_the_tray():
    """photo_tray: in a note of several photos a zoom on the whole asked photo, then the tray zoom; in a
    one-photo note the tray zoom alone; the answer as before."""
    tasks = [world_task(CFG, "detail", i) for i in range(12)]
    several = next(t for t in tasks if len(t.sources) > 1)
    one = next(t for t in tasks if len(t.sources) == 1)
    for task in (several, one):
        tray = demonstration(task, detail_zoom="tray")
        turns = demonstration(task, detail_zoom="photo_tray")
        calls = [t.call for t in turns if t.role == "assistant" and t.call]
        looks = calls[:-1]
        assert looks == ([{"name": "zoom", "image": task.meta["image"], "box": [0.0, 0.0, 1.0, 1.0]}]
                         if task is several else [])  # fmt: skip
        assert calls[-1] == next(t.call for t in tray if t.role == "assistant" and t.call)
        assert policy_turns(turns)[-1] == policy_turns(tray)[-1]
    look = [t for t in demonstration(several, detail_zoom="photo_tray") if t.role == "tool"][0]
    assert np.array_equal(look.image, several.sources[several.meta["image"] - 1])  # the photo, alone


def test_caption_demo_zooms_on_the_objects_or_the_tray():
    task = world_task(CFG, "caption", 0)

    def call(**kw):
        (c,) = [t.call for t in demonstration(task, **kw) if t.role == "assistant" and t.call]
        src = task.sources[0]
        return box_pixels(c["box"], src.shape[1], src.shape[0])

    x0, y0, x1, y1 = call()  # the tiny objects' padded box (the default)
    bx0, by0, bx1, by1 = task.meta["box"]
    assert x0 <= bx0 and y0 <= by0 and x1 >= bx1 and y1 >= by1 and (x1 - x0) - (bx1 - bx0) <= 3
    tray = call(caption_zoom="tray")
    assert tray == call(detail_zoom="tray", caption_zoom="tray")  # the detail knob does not move it
    tx0, ty0, tx1, ty1 = task.meta["tray"]
    assert (
        tray[0] <= tx0
        and tray[1] <= ty0
        and tray[2] >= tx1
        and tray[3] >= ty1
        and (tray[2] - tray[0]) - (tx1 - tx0) <= 8
    )
    with pytest.raises(ValueError, match="caption_zoom"):
        demonstration(task, caption_zoom="nowhere")


def test_bare_answers_name_no_object():
    from rl.agent.answers import objects_in

    for kind in ("detail", "dialogue"):
        task = world_task(CFG, kind, 3)
        replies = [t.text for t in demonstration(task, bare_answers=True) if t.policy and t.call is None]
        assert replies and all(objects_in(r) == [] for r in replies), replies
        named = [t.text for t in demonstration(task) if t.policy and t.call is None]
        assert all(objects_in(r) for r in named), named


@pytest.mark.parametrize("bare", [False, True])
def test_detail_reasoning_says_what_is_on_the_tray_then_answers_in_a_block(bare):
    """The tray as the world's reference caption words it, then the answer the plain demonstration gives,
    in an <answer> block: that block alone is scored, so every listed colour and count is not a hedge."""
    from rl.agent.parse import answer_text
    from rl.agent.world_tasks import reference_caption, world_note

    for index in range(6):
        task = world_task(CFG, "detail", index)
        plain = answer_turns(demonstration(task, detail_zoom="tray", bare_answers=bare))
        (reply,) = answer_turns(
            demonstration(task, detail_zoom="tray", bare_answers=bare, detail_reasoning=True)
        )
        scene = world_note(CFG, int(task.meta["note"].split("-")[1])).scenes[task.meta["image"] - 1]
        assert reference_caption(scene).endswith(task.meta["tray_text"])
        assert reply == f"{task.meta['tray_text']} <answer>{plain[0]}</answer>"
        assert answer_text(reply) == plain[0]
        assert score_answer(task, reply) == pytest.approx(1.0)


def test_change_demo_can_copy_the_first_compare_region_into_both_zooms():
    assert listed_regions("2 regions changed: [0.73, 0.37, 0.77, 0.39] [0.83, 0.19, 0.88, 0.21]") == [
        [0.73, 0.37, 0.77, 0.39],
        [0.83, 0.19, 0.88, 0.21],
    ]
    assert listed_regions("0 regions changed") == []
    task = world_task(CFG, "change", 1)
    turns = demonstration(task, change_zoom="region")
    compare, *zooms = [t.call for t in turns if t.role == "assistant" and t.call]
    region = listed_regions([t for t in turns if t.role == "tool"][0].text)[0]
    assert compare["name"] == "compare"
    assert zooms == [{"name": "zoom", "image": 1, "box": region}, {"name": "zoom", "image": 2, "box": region}]
    # the region holds the changed object's box (imgdiff is exact here: same clutter and noise)
    src = task.sources[0]
    x0, y0, x1, y1 = box_pixels(region, src.shape[1], src.shape[0])
    bx0, by0, bx1, by1 = task.meta["box"]  # the object's box padded by ZOOM_PAD
    assert bx0 <= x0 < x1 <= bx1 and by0 <= y0 < y1 <= by1
    assert policy_turns(turns)[-1] == policy_turns(demonstration(task))[-1]  # the same answer
    with pytest.raises(ValueError, match="change_zoom"):
        demonstration(task, change_zoom="nowhere")


def test_change_demo_can_let_compare_show_the_change():
    task = world_task(CFG, "change", 1)
    turns = demonstration(task, change_zoom="compare")
    calls = [t.call for t in turns if t.role == "assistant" and t.call]
    assert calls == [{"name": "compare", "images": [1, 2], "zoom": True}]
    (obs,) = [t for t in turns if t.role == "tool"]
    assert obs.text.startswith("1 region changed") and "image 1 then image 2 at" in obs.text
    assert obs.image is not None and obs.image.shape[0] == obs.image.shape[1]  # the first photo's crop
    assert policy_turns(turns)[-1] == policy_turns(demonstration(task))[-1]  # the same answer


def test_dialogue_demo_can_zoom_on_every_photo():
    for index in range(8):
        task = world_task(CFG, "dialogue", index)
        goal = task.meta["goal"]["images"]
        zoomed = {
            "goal": [t.call["image"] for t in demonstration(task) if t.role == "assistant" and t.call],
            "all": [
                t.call["image"]
                for t in demonstration(task, dialogue_zoom="all")
                if t.role == "assistant" and t.call
            ],
        }
        assert zoomed["goal"] == sorted(goal) and zoomed["all"] == list(range(1, len(task.sources) + 1))
        replies = [t.text for t in demonstration(task, dialogue_zoom="all") if t.policy and t.call is None]
        assert replies == [t.text for t in demonstration(task) if t.policy and t.call is None]
    with pytest.raises(ValueError, match="dialogue_zoom"):
        demonstration(task, dialogue_zoom="some")


@pytest.mark.parametrize("zoom", ["goal", "all"])
def test_dialogue_recovery_demo_errs_out_of_the_loss_then_recovers(zoom):
    for index in range(8):
        task = world_task(CFG, "dialogue", index)
        turns = demonstration(task, recovery=True, dialogue_zoom=zoom)
        plain = demonstration(task, dialogue_zoom=zoom)
        objection = next(i for i, t in enumerate(turns) if t.role == "user" and i > 0)
        before, after = turns[:objection], turns[objection + 1 :]
        # before the objection: the zooms but the last one and a wrong reply, all out of the loss
        assert all(not t.learn for t in before if t.policy) and all(t.learn for t in after if t.policy)
        zooms = [t.call["image"] for t in plain if t.policy and t.call]
        assert [t.call["image"] for t in before if t.policy and t.call] == zooms[:-1]
        assert [t.call["image"] for t in after if t.policy and t.call] == zooms[-1:]
        sim = UserSimulator(task, seed=0)
        wrong = before[-1]
        assert wrong.policy and wrong.call is None
        first = sim.reply(wrong.text)
        assert first.score < 1.0 and not first.done and first.text == turns[objection].text
        # the right replies after it satisfy the user, and are the plain demonstration's
        for t in after:
            if t.policy and t.call is None:
                sim.reply(t.text)
        assert sim.satisfied
        right = [t.text for t in after if t.policy and t.call is None]
        assert right == [t.text for t in plain if t.policy and t.call is None]
        n_before = sum(t.policy for t in before)
        assert unlearned(turns) == set(range(n_before)) and unlearned(turns, tools=False) == {0}
        again = demonstration(task, recovery=True, dialogue_zoom=zoom)
        assert unlearned(plain) == set() and [t.to_json() for t in again] == [t.to_json() for t in turns]


def test_recovery_applies_to_dialogues_only():
    for kind in ("detail", "change", "caption"):
        task = world_task(CFG, kind, 0)
        assert unlearned(demonstration(task, recovery=True)) == set()
