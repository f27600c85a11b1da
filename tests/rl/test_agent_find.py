"""The ``find`` tool (``rl.agent.find``, off unless in ``tool_modules``): which descriptions match a name, the
regions it shows for a scripted namer (whole image: small ones only; a box: any size), the model namer on a
tiny model (one answer per crop, each crop asked once), ``rl agent``'s namer (the policy's start), the
world's find demonstrations, and a short ``rl agent`` run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mm.config import ConfigError, load_config
from mm.errors import UserError
from mm.world import vocab
from rl.agent.config import AgentRunConfig
from rl.agent.parse import parse_call
from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS, Observation
from rl.agent.world_tasks import WorldTaskConfig, world_tasks
from tests.rl.agent_helpers import (
    painted_namer,
    run_tool_module,
    tiny_notevlm,
    tool_module,
    tray_detail_tasks,
)
from tests.rl.test_agent_objects import TINY

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}


@pytest.fixture
def find_tool(monkeypatch):
    """``rl.agent.find`` imported afresh (its tool registered, no namer); the registry restored afterwards."""
    yield from tool_module(monkeypatch, "rl.agent.find")


def colour_namer(asked: list | None = None):
    """Names a cut-out "a tiny <colour> square" by its most saturated pixel's colour; records each call."""

    def name(images):
        if asked is not None:
            asked.append(len(images))
        out = []
        for im in images:
            px = im.reshape(-1, 3).astype(int)
            p = px[np.argmax(px.max(axis=1) - px.min(axis=1))]
            out.append(f"It is a tiny {min(COLOURS, key=lambda c: sum(abs(p - COLOURS[c])))} square.")
        return out

    return name


def _scene() -> AgentTask:
    """A 200 x 200 grey photo: red 6x6 and blue 6x6 squares in the top row, red 8x8 below; a green 30x30
    square (900 px, over 0.5% of the photo)."""
    img = np.full((200, 200, 3), 128, np.uint8)
    img[20:26, 20:26] = COLOURS["red"]
    img[22:28, 100:106] = COLOURS["blue"]
    img[150:158, 150:158] = COLOURS["red"]
    img[100:130, 30:60] = COLOURS["green"]
    return AgentTask("t/detail", "detail", (img,), "q?", "a")


@pytest.mark.parametrize(
    "name, text, want",
    [
        ("tiny towel", "It is a tiny red towel.", True),
        ("tiny towels", "It is a tiny red towel.", True),  # plural asked, singular said
        ("tiny mice", "It is a tiny grey mouse.", True),  # the world's irregular plural
        ("tiny mouse", "two tiny mice", True),
        ("tiny cup", "It is a large red cup.", False),  # every word
        ("tiny cup", "It is a tiny cupboard.", False),  # whole words
        ("Tiny  CUP", "a tiny cup", True),
        ("the tiny cups", "It is a tiny red cup.", True),  # articles need not be said
        ("", "a tiny cup", False),
    ],
)
def test_matches(find_tool, name, text, want):
    assert find_tool.matches(name, text) is want


def test_find_shows_the_matching_small_regions_in_reading_order(find_tool):
    task = _scene()
    find_tool.set_namer(colour_namer())
    obs = find_tool.find(task, 1, "tiny red square")
    assert isinstance(obs, Observation)
    assert obs.text == '2 matches for "tiny red square" in image 1 of 1:'
    assert obs.labels == (" match 1:", " match 2:")
    src = task.sources[0]
    # each match is the square around it padded by objects' PAD (6 px), cut at full resolution
    assert np.array_equal(obs.images[0], src[14:32, 14:32]) and np.array_equal(
        obs.images[1], src[144:164, 144:164]
    )
    assert find_tool.find(task, 1, "tiny squares").text.startswith("3 matches")  # the green one is too large
    assert find_tool.find(task, 1, "tiny green square") == 'no match for "tiny green square" in image 1 of 1'
    inside = find_tool.find(task, 1, "tiny green square", box=[0.1, 0.45, 0.35, 0.7])  # a box: any size
    assert inside.text == '1 match for "tiny green square" in image 1 of 1 at [0.10, 0.45, 0.35, 0.70]:'


def test_find_without_a_namer_is_an_error_observation(find_tool):
    call = parse_call('<tool>{"name": "find", "image": 1, "object": "cup"}</tool>', TOOLS, n_images=1)
    obs = TOOLS.run(call, _scene())
    assert "find has no namer" in obs.text and "set_namer" in obs.text and obs.image is None


def test_bad_find_calls_are_parse_errors(find_tool):
    from rl.agent.parse import ParseError

    for text in ('{"name": "find", "image": 1}', '{"name": "find", "image": 3, "object": "cup"}',
                 '{"name": "find", "image": 1, "object": "cup", "box": [0.5, 0.5, 0.2, 0.9]}'):  # fmt: skip
        assert isinstance(parse_call(f"<tool>{text}</tool>", TOOLS, n_images=1), ParseError)


def test_model_namer_answers_each_crop_once(find_tool, tmp_path, monkeypatch):
    import rl.agent.backend as backend_module

    adapter = tiny_notevlm()
    adapter.model.save_pretrained(str(tmp_path / "m"))
    adapter.processor.save_pretrained(tmp_path / "m")
    rows = []
    real = backend_module.backend_for

    def counting(adapter):
        backend = real(adapter)
        generate = backend.generate

        def counted(batch, **kw):
            rows.append(len(batch))
            return generate(batch, **kw)

        backend.generate = counted
        return backend

    monkeypatch.setattr(backend_module, "backend_for", counting)
    namer = find_tool.model_namer(tmp_path / "m", batch_size=2, max_new_tokens=4)
    a, b, c = (np.full((12, 12, 3), v, np.uint8) for v in (10, 120, 240))
    said = namer([a, b, a, c])
    assert len(said) == 4 and said[0] == said[2] and all(isinstance(s, str) for s in said)
    assert rows == [2, 1]  # three distinct crops, two per batch
    assert namer([c, b]) == [said[3], said[1]] and rows == [2, 1]  # cached: no model call
    # prepare names many cut-outs a batch: a batch's names are those asked one at a time
    crops = [np.random.default_rng(i).integers(0, 256, (12, 12, 3), dtype=np.uint8) for i in range(6)]
    one = find_tool.model_namer(tmp_path / "m", batch_size=1, max_new_tokens=4)(crops)
    assert find_tool.model_namer(tmp_path / "m", batch_size=6, max_new_tokens=4)(crops) == one


def test_rl_agent_takes_the_policy_start_as_namer(find_tool, tmp_path):
    from rl.agent.tools import configure_tool_modules

    cfg = load_config(AgentRunConfig, TINY, ["tool_modules=[rl.agent.find]"])
    with pytest.raises(UserError, match="set policy.init=MODEL_FOLDER or note_model.build=true"):
        configure_tool_modules(cfg.tool_modules, cfg)
    cfg = load_config(AgentRunConfig, TINY, ["tool_modules=[rl.agent.find]", f"policy.init={tmp_path}"])
    configure_tool_modules(cfg.tool_modules, cfg)
    assert find_tool._namer is not None  # loaded on its first call


def test_find_demonstrations_ask_for_the_question_words(find_tool):
    from rl.agent.world_demos import demonstration, detail_answer, policy_turns

    tasks = tray_detail_tasks(8)
    truth = {}  # an oracle namer: each cut-out named after the tiny object inside its region, if any
    for t in tasks:
        for f, crop in find_tool.regions(t, t.meta["image"]):
            inside = [
                o for o in t.meta["tiny"] if f.box[0] <= o[2] < f.box[2] and f.box[1] <= o[3] < f.box[3]
            ]
            truth[crop.tobytes()] = f"It is a tiny {inside[0][1]} {inside[0][0]}." if inside else "A stroke."
    find_tool.set_namer(lambda images: [truth[im.tobytes()] for im in images])
    for t in tasks:
        turns = demonstration(t, detail_zoom="find")
        call = turns[1].call
        assert (
            call["name"] == "find" and call["image"] == t.meta["image"] and call["object"][4:] in t.question
        )
        assert call["object"].startswith("the tiny ")
        if t.meta["ask"] == "count":
            assert turns[2].text.startswith(f"{t.answer} match")  # the oracle finds every one
        else:
            assert turns[2].text.startswith("1 match") and t.answer in truth[turns[2].image.tobytes()]
        assert policy_turns(turns)[-1] == detail_answer(t.meta["ask"], t.answer, t.meta["object"])


def test_caption_find_demonstrations_cut_out_the_regions_named_tiny(find_tool):
    from mm.config import load_config as load
    from rl.agent.world_demos import CAPTION_FIND, demonstration, policy_turns
    from rl.agent.world_tasks import WorldTaskConfig, world_tasks

    tasks = list(
        world_tasks(load(WorldTaskConfig, None, ["seed=0", "detail.tray_spots=3"]), "caption", "train", 6)
    )
    on_tray = {}  # a namer that calls the regions inside the tray tiny and the rest something else
    for t in tasks:
        x0, y0, x1, y1 = t.meta["tray"]
        for f, crop in find_tool.regions(t, 1):
            inside = x0 <= f.box[0] and y0 <= f.box[1] and f.box[2] <= x1 and f.box[3] <= y1
            on_tray[crop.tobytes()] = "It is a tiny cup." if inside else "It is a red stroke."
    find_tool.set_namer(lambda images: [on_tray[im.tobytes()] for im in images])
    for t in tasks:
        turns = demonstration(t, caption_zoom="find")
        assert turns[1].call == CAPTION_FIND
        n = sum(on_tray[crop.tobytes()] == "It is a tiny cup." for _, crop in find_tool.regions(t, 1))
        assert n >= 1 and turns[2].text.startswith(
            f'{n} match{"es" if n > 1 else ""} for "tiny" in image 1 of 1'
        )
        assert policy_turns(turns)[-1] == t.answer  # then the reference caption


def test_find_demonstrations_need_the_module(find_tool):
    with pytest.raises(ConfigError, match=r"tool_modules=\[rl.agent.find\]"):
        load_config(AgentRunConfig, TINY, ["data.detail_zoom=find"])
    with pytest.raises(ConfigError, match=r"data.caption_zoom=find .* 'tool_modules=\[rl.agent.find\]"):
        load_config(AgentRunConfig, TINY, ["data.caption_zoom=find"])


def test_cli_runs_with_find(find_tool, tmp_path):
    from rl.agent.loop import instructions

    adapter = tiny_notevlm()
    adapter.model.save_pretrained(str(tmp_path / "m"))
    adapter.processor.save_pretrained(tmp_path / "m")
    sets = ["data.detail_zoom=find", "tool_modules=[rl.agent.find]", f"policy.init={tmp_path / 'm'}"]
    _, detail = run_tool_module(tmp_path, TINY, sets)
    assert "find(image, box, object)" in instructions(TOOLS)  # the policy is told of it
    assert {t.calls[0].call.name for t in detail} == {"find"}
    assert all("match" in t.calls[0].observation for t in detail)  # the namer ran (whatever it said)


def test_task_export_writes_find_calls_without_a_namer(find_tool, tmp_path, capsys):
    import json

    from rl.agent.task_export import main

    assert main(["--out", str(tmp_path), "--tasks", "2", "--zoom", "find"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    for r in rows:
        (call,) = r["demo"]
        assert call["name"] == "find" and call["object"].replace("the ", "", 1) in r["question"]


def test_find_registers_find_alone():
    import subprocess
    import sys

    code = (
        "import sys, rl.agent.find; from rl.agent.tools import TOOLS; "
        "print(TOOLS.names, 'rl.agent.objects' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['zoom', 'compare', 'find'] False"  # the region proposer is rl.agent.regions


def test_dialogue_find_demonstrations_search_every_photo_in_the_users_words(find_tool):
    from mm.config import load_config as load
    from rl.agent.simulator import SimulatorConfig
    from rl.agent.world_demos import demonstration, goal_find_call

    cfg = load(WorldTaskConfig, None, ["seed=0", "detail.tray_spots=3"])
    tasks = [t for t in world_tasks(cfg, "dialogue", "train", 12) if len(t.sources) > 1][:4]
    find_tool.set_namer(lambda images: ["It is something."] * len(images))  # matches nothing
    user = SimulatorConfig(patience=2, max_turns=4)
    for t in tasks:
        plural = vocab.category(t.meta["goal"]["object"]).plural
        assert goal_find_call(t) == {"name": "find", "object": f"the tiny {plural}"}
        assert f"tiny {plural}" in t.question  # the user's words
        turns = demonstration(t, dialogue_zoom="find", user=user)
        assert [x.call for x in turns if x.role == "assistant" and x.call] == [goal_find_call(t)]
        seen = [x.text for x in turns if x.role == "tool"]
        assert seen == [f'no match for "the tiny {plural}" in images 1-{len(t.sources)}']
        assert turns[-1].role == "user"  # the replies satisfied the simulated user
    with pytest.raises(ConfigError, match="dialogue_recovery=0"):
        load_config(AgentRunConfig, TINY, ["data.dialogue_zoom=find", "data.dialogue_recovery=0.5",
                                           "tool_modules=[rl.agent.find]"])  # fmt: skip


def test_find_without_an_image_looks_at_every_photo(find_tool):
    one = _scene()
    task = AgentTask("t/2", "detail", (one.sources[0], one.sources[0][:, ::-1].copy()), "q", "a", {})
    find_tool.set_namer(colour_namer())
    single = find_tool.find(task, 1, "tiny red square")
    both = find_tool.find(task, object="tiny red square")
    n = len(single.images)
    assert both.text == f'{2 * n} matches for "tiny red square" in images 1-2:'
    assert both.labels == tuple(f" match {k} (image {1 + (k > n)}):" for k in range(1, 2 * n + 1))
    assert [im.tobytes() for im in both.images[:n]] == [im.tobytes() for im in single.images]
    alone = find_tool.find(one, object="tiny red square")  # a note of one photo: as with image 1
    assert (
        alone.text
        == find_tool.find(one, 1, "tiny red square").text
        == f'{n} matches for "tiny red square" in image 1 of 1:'
    )
    assert alone.labels == single.labels == tuple(f" match {k}:" for k in range(1, n + 1))
    call = parse_call('<tool>{"name": "find", "object": "the tiny cup"}</tool>', TOOLS, n_images=2)
    assert call.args == {"object": "the tiny cup"}
    boxed = parse_call(
        '<tool>{"name": "find", "object": "cup", "box": [0, 0, 1, 1]}</tool>', TOOLS, n_images=2
    )
    assert "give its image too" in boxed.message


def test_labels_say_what_the_namer_said_of_each_match(find_tool):
    task = _scene()
    find_tool.set_namer(colour_namer())
    assert find_tool.set_labels(True) is False
    obs = find_tool.find(task, 1, "tiny red square")
    assert obs.labels == (" match 1: It is a tiny red square.", " match 2: It is a tiny red square.")
    assert obs.text == '2 matches for "tiny red square" in image 1 of 1 (two tiny red squares):'
    two = AgentTask("t/2", "detail", (task.sources[0], task.sources[0]), "q", "a", {})
    assert find_tool.find(two, object="tiny blue square").labels == (
        " match 1 (image 1): It is a tiny blue square.",
        " match 2 (image 2): It is a tiny blue square.",
    )
    find_tool.set_labels(False)
    assert find_tool.find(task, 1, "tiny red square").labels == (" match 1:", " match 2:")


def test_tool_options_reach_the_module_and_bad_ones_are_refused(find_tool, tmp_path):
    from rl.agent.tools import check_tool_options, configure_tool_modules

    on = "tool_options={rl.agent.find: {labels: true}}"
    cfg = load_config(AgentRunConfig, TINY, ["tool_modules=[rl.agent.find]", f"policy.init={tmp_path}", on])
    check_tool_options(cfg.tool_options)
    configure_tool_modules(cfg.tool_modules, cfg)
    assert find_tool._labels is True
    off = load_config(AgentRunConfig, TINY, ["tool_modules=[rl.agent.find]", f"policy.init={tmp_path}"])
    configure_tool_modules(off.tool_modules, off)  # the default: no labels, no groups
    assert find_tool._labels is False and find_tool._group is False
    grouped = [f"policy.init={tmp_path}", on.replace("true}", "true, group: true}")]
    both = load_config(AgentRunConfig, TINY, ["tool_modules=[rl.agent.find]", *grouped])
    configure_tool_modules(both.tool_modules, both)
    assert find_tool._labels is True and find_tool._group is True
    with pytest.raises(ConfigError, match="does not load; add the module to tool_modules"):
        load_config(AgentRunConfig, TINY, [on])
    with pytest.raises(UserError, match=r"has no option 'label'; its options: \['group', 'labels'\]"):
        check_tool_options({"rl.agent.find": {"label": True}})
    with pytest.raises(UserError, match="option 'labels' takes a bool, got 1"):
        check_tool_options({"rl.agent.find": {"labels": 1}})
    with pytest.raises(UserError, match="has no option 'x'; its options: none"):
        check_tool_options({"json": {"x": 1}})  # a module that declares no OPTIONS takes none


def test_tally_counts_the_things_named_in_order_of_first_mention(find_tool):
    said = ["It is a tiny blue mouse.", "It is a tiny orange pencil.", "It is a tiny white pencil.",
            "It is a tiny red apple.", "A tiny grey mouse", "It is a tiny red pencil."]  # fmt: skip
    assert find_tool.tally(said) == "two mice, three pencils and an apple"
    assert find_tool.tally(said, "tiny") == "two tiny mice, three tiny pencils and a tiny apple"
    assert find_tool.tally(said[1:3], "the tiny pencils") == "two tiny pencils"  # the thing is not repeated
    assert find_tool.tally(said[:1]) == "a mouse" and find_tool.thing("It is a tiny red towel.") == "towel"
    assert find_tool.tally(["a cup"] * 12) == "12 cups" and find_tool.tally(["an egg"], "the") == "an egg"


def test_group_puts_the_matches_of_one_thing_side_by_side(find_tool):
    said = ["It is a tiny blue mouse.", "It is a tiny orange pencil.", "It is a tiny red apple.",
            "It is a tiny grey mouse.", "It is a tiny white pencil."]  # fmt: skip
    assert find_tool.grouped(said) == [0, 3, 1, 4, 2]
    assert find_tool.grouped([]) == [] and find_tool.grouped(said[:1]) == [0]
    task = _scene()  # red, blue (top row), red (below), in reading order
    squares = colour_namer()
    find_tool.set_namer(lambda ims: [s.replace("blue square", "blue dot") for s in squares(ims)])
    find_tool.set_labels(True)
    plain = find_tool.find(task, 1, "tiny")
    assert [lab.split()[-2] for lab in plain.labels] == ["red", "blue", "red"]
    assert find_tool.set_group(True) is False
    obs = find_tool.find(task, 1, "tiny")
    # the same count, in the same order of first mention
    assert obs.text == plain.text == '3 matches for "tiny" in image 1 of 1 (two tiny squares and a tiny dot):'
    assert [lab.split()[-2] for lab in obs.labels] == ["red", "red", "blue"]
    assert [lab.split(":")[0] for lab in obs.labels] == [" match 1", " match 2", " match 3"]
    by_pixels = {c.tobytes(): k for k, c in enumerate(plain.images)}
    assert [by_pixels[c.tobytes()] for c in obs.images] == [0, 2, 1]  # the cut-outs follow
    find_tool.set_group(False)


def test_caption_demonstrations_follow_the_order_find_counted_in(find_tool):
    from rl.agent.world_demos import caption_demo, tray_in_order

    cap = (
        "The photo shows two lamps (purple and red). On the tray are a tiny blue mouse, two tiny pencils "
        "(orange and white) and a tiny purple keyboard."
    )
    head = "The photo shows two lamps (purple and red). On the tray are "
    assert tray_in_order(cap, "a keyboard, a pencil and two mice") == (
        head + "a tiny purple keyboard, two tiny pencils (orange and white) and a tiny blue mouse."
    )
    assert tray_in_order(cap, "a pencil") == (  # what the tally does not name keeps its order, last
        head + "two tiny pencils (orange and white), a tiny blue mouse and a tiny purple keyboard."
    )
    task = AgentTask("t/caption", "caption", (np.zeros((8, 8, 3), np.uint8),), "Describe.", cap, {})
    said = '4 matches for "tiny" in image 1 of 1 (a keyboard, two pencils and a mouse):'
    turns = caption_demo(task, lambda call, t: (said, None), zoom="find")
    assert turns[-1].text == tray_in_order(cap, "a keyboard, two pencils and a mouse")
    plain = caption_demo(task, lambda call, t: ('4 matches for "tiny" in image 1 of 1:', None), zoom="find")
    assert plain[-1].text == cap  # no tally (labels off): the reference caption as it is


def test_a_run_trained_without_tool_options_refuses_to_resume_with_them(find_tool, tmp_path):
    from rl.agent.run import check_training_config
    from tests.rl.agent_helpers import recorded_before

    plain = load_config(AgentRunConfig, TINY, ["tool_modules=[rl.agent.find]"])
    recorded_before(plain, tmp_path, "tool_options")
    check_training_config(plain, tmp_path)  # at its default then: resumes
    labelled = load_config(
        AgentRunConfig, TINY, ["tool_modules=[rl.agent.find]", "tool_options={rl.agent.find: {labels: true}}"]
    )
    with pytest.raises(UserError, match="other tool_options settings"):
        check_training_config(labelled, tmp_path)


def test_prepare_names_every_photo_region_ahead_in_full_batches(find_tool):
    from rl.agent.tools import prepare_tool_modules

    named: list[int] = []
    find_tool.set_namer(painted_namer(find_tool, named))
    tasks = [_scene(), *tray_detail_tasks(2)]
    small = sum(len(find_tool.regions(t, j)) for t in tasks for j in range(1, len(t.sources) + 1))
    prepare_tool_modules(["rl.agent.find"], tasks)
    unique = len(find_tool._namer.cache)
    assert 3 <= unique <= small and sum(named) == unique  # every small region of every photo, each once
    assert named == [4] * (unique // 4) + ([unique % 4] if unique % 4 else [])  # full batches
    # the find calls then hit the cache, and see what a namer asked on demand would have said
    said = [find_tool.find(t, j, "tiny") for t in tasks for j in range(1, len(t.sources) + 1)]
    assert sum(named) == unique
    fresh = painted_namer(find_tool)
    find_tool.set_namer(fresh)
    again = [find_tool.find(t, j, "tiny") for t in tasks for j in range(1, len(t.sources) + 1)]
    assert [getattr(o, "text", o) for o in said] == [getattr(o, "text", o) for o in again]
    assert any(isinstance(o, Observation) for o in said)


def test_prepare_leaves_a_plain_namer_to_name_on_demand(find_tool):
    from rl.agent.tools import prepare_tool_modules

    asked: list[int] = []
    find_tool.set_namer(colour_namer(asked))
    prepare_tool_modules(["rl.agent.find"], [_scene()])
    assert asked == []  # no cache to fill: nothing named ahead
    assert isinstance(find_tool.find(_scene(), 1, "red square"), Observation)
    assert asked == [3]  # its 3 small regions, named on demand


def test_prepare_shares_the_naming_out_over_two_processes(tmp_path):
    from tests.rl.test_agent_dp import _launch

    out = tmp_path / "names.json"
    proc = _launch(str(out), module="tests.rl.agent_find_dp_worker")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    a, b = res["ranks"]
    assert res["world"] == 2 and a["named"] > 0 and b["named"] > 0
    assert a["named"] + b["named"] == res["alone"]  # each region of every photo named by one rank alone
    assert a["cache"] == b["cache"] and len(a["cache"]) == res["alone"]  # and every rank holds every name
    assert a["after_find"] == b["after_find"] == 0  # find's calls then hit the cache
    assert a["said"] == b["said"] == res["truth"]  # what one process naming on demand shows
