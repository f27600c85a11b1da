"""Users' task files for ``rl agent`` (``rl.agent.task_file``): what a line becomes, every bad line a clear
error naming ``file:line``, answers scored after VQA normalisation, world tasks exported to a file and read
back unchanged, and ``rl agent`` trained and evaluated on files end to end (resume; a changed file is
other tasks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mm.errors import UserError
from rl.agent.backend import Segment
from rl.agent.qa import matches, normalise, rival_in, score_qa
from rl.agent.scoring import eval_row, first_aim, trajectory_reward
from rl.agent.task_export import export_tasks
from rl.agent.task_file import count_tasks, read_task_file
from rl.agent.trajectory import Trajectory
from rl.agent.world_demos import demonstration, loop_observation, qa_demo
from rl.agent.world_tasks import WorldTaskConfig, world_tasks

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A PNG (RGBA), a phone JPEG stored sideways with EXIF orientation 6, a grayscale PNG."""
    photos = tmp_path / "photos"
    photos.mkdir()
    rgba = np.dstack([_photo(40, 60, 0), np.full((40, 60), 255, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(photos / "a.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 60 wide x 40 high; shown rotated 90 degrees clockwise: 40 wide x 60 high
    Image.fromarray(_photo(40, 60, 1)).save(photos / "b.jpg", exif=exif, quality=95)
    Image.fromarray(_photo(40, 60, 2)[..., 0], "L").save(photos / "c.png")
    return tmp_path


def _write(folder: Path, *records: dict | str, name: str = "tasks.jsonl") -> Path:
    path = folder / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


GOOD = {"image": ["photos/a.png", "photos/b.jpg"], "question": "What colour is the jar?", "answer": "red"}


def test_a_line_becomes_a_task(folder):
    path = _write(
        folder,
        {**GOOD, "id": "n1", "text": "Our shelf!", "answer": ["red", "dark red"], "match": "contains",
         "demo": [{"name": "zoom", "image": 2, "box": [0.25, 0.5, 0.75, 1.0]}], "demo_answer": "It is red.",
         "where": {"image": 2, "box": [0.5, 0.5, 0.75, 0.75]}, "source": "survey 3"},
        "",
        {"image": "photos/c.png", "question": " How many cups? ", "answer": "2"},
    )  # fmt: skip
    first, second = read_task_file(path)
    assert (first.task_id, first.kind, first.question) == ("n1", "qa", "Our shelf!\nWhat colour is the jar?")
    assert first.meta["answers"] == ["red", "dark red"] and first.answer == "red"
    assert first.meta["match"] == "contains" and first.meta["demo_answer"] == "It is red."
    assert first.meta["record"] == {"source": "survey 3"}
    a, b = first.sources
    assert a.shape == (40, 60, 3) and np.array_equal(a, _photo(40, 60, 0))  # alpha dropped, exact
    assert b.shape == (60, 40, 3)  # the phone photo upright
    # where: image 2 and its box in source pixels (40 wide, 60 high)
    assert first.meta["image"] == 2 and first.meta["box"] == [20, 30, 30, 45]
    # defaults: the id is the line number, exact match, the first answer demonstrated, no calls
    assert (second.task_id, second.question, second.meta["match"]) == ("3", "How many cups?", "exact")
    assert second.meta["demo"] == [] and second.meta["demo_answer"] == "2" and "image" not in second.meta
    assert second.sources[0].shape == (40, 60, 3)  # grayscale read as RGB
    assert count_tasks(path) == 2


def test_images_are_shrunk_to_max_side_and_read_once(folder):
    Image.fromarray(_photo(300, 500, 3)).save(folder / "photos/big.png")
    path = _write(
        folder, {**GOOD, "image": "photos/big.png"}, {**GOOD, "image": ["photos/big.png", "photos/a.png"]}
    )
    one, two = read_task_file(path, max_side=100)
    assert one.sources[0].shape == (60, 100, 3)
    assert one.sources[0] is two.sources[0]  # one array per distinct image
    assert read_task_file(path, max_side=0)[0].sources[0].shape == (300, 500, 3)


def test_an_image_cache_maps_the_same_pixels_and_decodes_once(folder, tmp_path, monkeypatch):
    import rl.agent.task_file as task_file

    path = _write(folder, GOOD, {**GOOD, "image": ["photos/c.png", "photos/a.png"]})
    cache = tmp_path / "cache"
    plain, cached = read_task_file(path), read_task_file(path, image_cache=cache)
    for a, b in zip(plain, cached, strict=True):
        assert len(a.sources) == len(b.sources)
        for x, y in zip(a.sources, b.sources, strict=True):
            assert isinstance(y, np.memmap) and np.array_equal(x, y)
    assert cached[0].sources[0] is cached[1].sources[1]  # one map per distinct image
    assert len(list(cache.glob("*.npy"))) == 3

    def no_decode(*args):
        raise AssertionError("decoded again")

    monkeypatch.setattr(task_file, "read_image", no_decode)
    again = read_task_file(path, image_cache=cache)
    assert np.array_equal(again[1].sources[0], plain[1].sources[0])


def test_image_folder_replaces_the_files_folder(folder, tmp_path):
    elsewhere = tmp_path / "lists"
    elsewhere.mkdir()
    path = _write(elsewhere, {**GOOD, "image": "a.png"})
    with pytest.raises(UserError, match="image.*not found"):
        read_task_file(path)
    assert read_task_file(path, image_folder=folder / "photos")[0].sources[0].shape == (40, 60, 3)


BAD = [
    ("not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({**GOOD, "image": []}, "'image' must be a path"),
    ({**GOOD, "image": "photos/missing.png"}, r"image\(s\) not found.*missing.png"),
    ({**GOOD, "image": "photos/broken.png"}, "cannot read image"),
    ({**GOOD, "question": " "}, "non-empty 'question'"),
    ({**GOOD, "text": 3}, "'text' must be a string"),
    ({k: v for k, v in GOOD.items() if k != "answer"}, "'answer' must be"),
    ({**GOOD, "answer": ["red", ""]}, "'answer' must be"),
    ({**GOOD, "answer": ["red", "?!"]}, "no words once normalised"),
    ({**GOOD, "match": "fuzzy"}, "'match' must be one of"),
    ({**GOOD, "choices": ["red", "blue"]}, "'choices' is read under"),
    ({**GOOD, "match": "contains", "choices": "red"}, "'choices' must be a list"),
    ({**GOOD, "match": "contains", "choices": ["red", "?"]}, "'choices' must be a list"),
    ({**GOOD, "demo_answer": ""}, "'demo_answer'"),
    ({**GOOD, "demo": {"name": "zoom"}}, "'demo' must be a list"),
    ({**GOOD, "demo": [{"name": "zoom", "image": 3, "box": [0, 0, 1, 1]}]}, "demo call 1 .* refused"),
    ({**GOOD, "demo": [{"name": "crop", "image": 1}]}, "unknown tool"),
    (
        {**GOOD, "demo": [{"name": "compare", "images": [1, 2]}]},
        "demo call 1 .* fails: error: images 1 and 2",
    ),
    ({**GOOD, "where": {"image": 1, "box": [0.5, 0.5, 0.4, 0.6]}}, "'where' must be"),
    ({**GOOD, "where": {"image": 3, "box": [0, 0, 1, 1]}}, "'where' must be"),
    ({**GOOD, "id": [1]}, "'id' must be"),
]


@pytest.mark.parametrize("line,message", BAD, ids=[m for _, m in BAD])
def test_a_bad_line_is_one_error_naming_it(folder, line, message):
    (folder / "photos/broken.png").write_bytes(b"\x89PNG not really")
    path = _write(folder, GOOD, line)
    with pytest.raises(UserError, match=message) as e:
        read_task_file(path)
    assert f"{path}:2:" in str(e.value)


def test_a_file_is_refused_whole(folder, tmp_path):
    with pytest.raises(UserError, match="ids must be unique"):
        read_task_file(_write(folder, {**GOOD, "id": "x"}, {**GOOD, "id": "x"}))
    with pytest.raises(UserError, match="has no tasks"):
        read_task_file(_write(folder, "", "  "))
    with pytest.raises(UserError, match="not found"):
        read_task_file(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    "text,expected",
    [("The Two cups!", "2 cups"), ("  It's RED. ", "it's red"), ("a 1,000 cats", "1000 cats"), ("None", "0"),
     ("an apple; a pear", "apple pear"), ("(A)", "a"), ("The", "the")],
)  # fmt: skip
def test_normalise_is_vqa_evals(text, expected):
    assert normalise(text) == expected


def test_answers_are_scored_exact_or_contained(folder):
    exact, contains = read_task_file(
        _write(
            folder, {**GOOD, "answer": ["2", "two cups"]}, {**GOOD, "answer": "dark red", "match": "contains"}
        )
    )
    assert score_qa(exact, "Two.") == score_qa(exact, "2") == score_qa(exact, "the two cups") == 1.0
    assert score_qa(exact, "There are 2.") == 0.0 and score_qa(exact, "") == 0.0
    assert score_qa(exact, '<tool>{"name": "zoom"}</tool> 2') == 1.0  # tool text is not read
    assert score_qa(exact, "I think 3 <answer>two</answer>") == 1.0  # only the answer block
    assert score_qa(contains, "It is dark red.") == 1.0 and score_qa(contains, "It is red.") == 0.0
    assert not matches("darkred", "dark red", "contains")
    assert matches("(A)", "A", "exact") and not matches("", "A", "exact")  # a choice letter is not empty
    with pytest.raises(ValueError, match="match"):
        matches("a", "a", "fuzzy")


def test_contains_refuses_a_hedge(folder):
    count, yes, colour, dark, free = read_task_file(
        _write(
            folder,
            {**GOOD, "answer": "3", "match": "contains"},
            {**GOOD, "answer": "yes", "match": "contains"},
            {**GOOD, "answer": "red", "match": "contains", "choices": ["red", "blue", "green"]},
            {**GOOD, "answer": ["dark red"], "match": "contains", "choices": ["red", "dark red", "blue"]},
            {**GOOD, "answer": "3", "match": "contains", "choices": []},
        )
    )
    assert score_qa(count, "There are three cups.") == score_qa(count, "3") == 1.0
    assert score_qa(count, "There are 2 or 3 cups.") == score_qa(count, "3, maybe four") == 0.0
    assert score_qa(yes, "Yes, it is.") == 1.0 and score_qa(yes, "Yes or no.") == 0.0
    assert score_qa(colour, "It is red.") == 1.0 and score_qa(colour, "Red, 2 of them.") == 1.0
    assert score_qa(colour, "red or blue") == score_qa(colour, "It is blue.") == 0.0
    assert score_qa(dark, "It is dark red.") == 1.0  # "red" inside the accepted answer is not a rival
    assert score_qa(dark, "Dark red and red.") == score_qa(dark, "dark red or blue") == 0.0
    assert score_qa(free, "2 or 3") == 1.0  # choices: [] turns the check off
    assert rival_in("3 or 4 or 5", ["3"], None) == "4" and rival_in("the 3", ["3"], None) is None
    assert rival_in("cat or dog", ["cat"], None) is None  # no rule for free text without choices


def test_qa_trajectories_are_rewarded_and_rowed_like_world_tasks(folder):
    (task,) = read_task_file(_write(folder, {**GOOD, "where": {"image": 1, "box": [0.0, 0.0, 0.5, 0.5]}}))
    traj = Trajectory.start(task, Segment([1, 2, 3]))
    traj.answer = "Red."
    assert (
        trajectory_reward(traj, invalid_call_penalty=0.1, hallucination_weight=0.5, turn_reward_weight=0.0)
        == 1.0
    )
    row = eval_row(traj, seed=0)
    assert (row["kind"], row["correct"], row["aim"]) == ("qa", 1.0, "no_zoom") and first_aim(
        traj
    ) == "no_zoom"


def test_world_tasks_exported_to_a_file_read_back_unchanged(tmp_path):
    world = WorldTaskConfig(seed=0)
    path = export_tasks(world, tmp_path / "tasks", "train", 4, zoom="tray")
    tasks, originals = read_task_file(path, max_side=0), list(world_tasks(world, "detail", "train", 4))
    for task, original in zip(tasks, originals, strict=True):
        assert task.task_id == original.task_id and task.question == original.question
        assert all(np.array_equal(a, b) for a, b in zip(task.sources, original.sources, strict=True))
        assert task.meta["answers"] == [original.answer] and task.meta["image"] == original.meta["image"]
        a0, b0, a1, b1 = original.meta["box"]
        x0, y0, x1, y1 = task.meta["box"]
        assert x0 <= a0 and y0 <= b0 and x1 >= a1 and y1 >= b1 and (x1 - x0) - (a1 - a0) <= 1
        # the file's demonstration shows what the world's shows, then the value alone
        mine = qa_demo(task, loop_observation)
        theirs = demonstration(original, detail_zoom="tray")
        assert [t.text for t in mine[:-1]] == [t.text for t in theirs[:-1]]
        assert all(
            (a.image is None and b.image is None) or np.array_equal(a.image, b.image)
            for a, b in zip(mine, theirs)
        )
        assert mine[-1].text == original.answer and score_qa(task, mine[-1].text) == 1.0


def _files(tmp_path: Path) -> tuple[Path, Path]:
    world = WorldTaskConfig(seed=0)
    return (
        export_tasks(world, tmp_path / "tasks", "train", 4),
        export_tasks(world, tmp_path / "tasks", "test", 3, start=200),
    )


def test_cli_trains_and_evaluates_on_task_files(tmp_path, capsys):
    from rl.cli import main

    train, test = _files(tmp_path)
    out = tmp_path / "run"
    args = ["agent", "--config", str(TINY), "--out", str(out), "--set", "sft.steps=2", "grpo.steps=2",
            "eval.n_boot=20", "perception.steps=0", f"data.file={train}", f"eval.file={test}"]  # fmt: skip
    assert main(args) == 0
    assert "a task file: no targets" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["targets"] == [] and report["file"] == str(test)
    assert (
        "accuracy/qa" in report["metrics"]["tool_grpo"]
        and "accuracy/qa" in report["gains_tool_grpo_over_notool_sft"]
    )
    rows = [json.loads(x) for x in (out / "eval/tool_sft.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == [t.task_id for t in read_task_file(test)]
    assert {r["kind"] for r in rows} == {"qa"} and all("aim" in r for r in rows)
    md = (out / "report.md").read_text()
    assert f"The tasks of {test}" in md and "| accuracy/qa |" in md and "| accuracy/detail |" not in md
    cached = [*args, f"data.image_cache={tmp_path / 'cache'}"]  # where images are kept is no new run
    assert main(cached) == 0 and "grpo: done before, skipped" in capsys.readouterr().out
    assert len(list((tmp_path / "cache").glob("*.npy"))) > 0
    # the trained policy as a folder: loaded as any model, and the start of another run
    from mm.model.adapter import load_adapter
    from rl.agent.policy_init import load_policy

    trained = torch.load(out / "grpo/model.pt", weights_only=True)
    folder = out / "export/tool_grpo"
    assert json.loads((out / "export/result.json").read_text())["models"] == ["tool_grpo"]
    state = load_adapter(str(folder)).model.state_dict()
    assert state.keys() == trained.keys() and all(torch.equal(state[k], trained[k]) for k in trained)
    policy = load_policy(str(folder), ["max_images=8", "max_length=1024"]).model.state_dict()
    assert all(torch.equal(policy[k], trained[k]) for k in trained)
    # another eval file at the same path: the eval runs again; another train file: the resume is refused
    test.write_text("\n".join(test.read_text().splitlines()[:2]) + "\n")
    assert main(args) == 0
    log = capsys.readouterr().out
    assert "grpo: done before, skipped" in log and "eval: done in" in log
    assert len((out / "eval/tool_grpo.jsonl").read_text().splitlines()) == 2
    train.write_text("\n".join(train.read_text().splitlines()[:3]) + "\n")
    assert main(args) == 2
    assert "other data settings" in capsys.readouterr().err


def test_sft_replays_the_files_calls_and_the_baseline_answers_at_once(tmp_path):
    from mm.config import load_config
    from rl.agent.config import AgentRunConfig
    from rl.agent.stages import build_backend, demo_trajectories, train_tasks

    train, test = _files(tmp_path)
    cfg = load_config(AgentRunConfig, TINY, ["perception.steps=0", f"data.file={train}", f"eval.file={test}"])
    tasks = train_tasks(cfg)
    backend = build_backend(cfg)
    with_tools = demo_trajectories(backend, cfg, tasks, tools=True)
    for traj, task in zip(with_tools, tasks, strict=True):
        assert [c.call.name for c in traj.calls] == ["zoom"] and traj.n_valid_calls == 1
        assert traj.calls[0].call.args == {k: v for k, v in task.meta["demo"][0].items() if k != "name"}
        assert traj.answer.strip() == task.answer and len(traj.segment.images) == len(task.sources) + 1
    for traj, task in zip(demo_trajectories(backend, cfg, tasks, tools=False), tasks, strict=True):
        assert traj.calls == [] and traj.answer.strip() == task.answer


@pytest.mark.parametrize(
    "override,message",
    [([], "set eval.file"), (["perception.steps=2"], "perception.steps > 0"),
     (["note_model.build=true", "policy.init=null"], "note_model.build=true"),
     (["data.max_side=-1"], "max_side")],
)  # fmt: skip
def test_a_task_file_config_that_cannot_work_is_an_error(override, message):
    from mm.config import ConfigError, load_config
    from rl.agent.config import AgentRunConfig

    base = ["perception.steps=0", "data.file=train.jsonl"] + (
        [] if override == [] else ["eval.file=test.jsonl"]
    )
    with pytest.raises((ConfigError, ValueError), match=message):
        load_config(AgentRunConfig, TINY, [*base, *override])


@pytest.fixture
def find_module(monkeypatch):
    """``rl.agent.find`` (agent_world.yaml's tool module) for one test; the registry restored afterwards."""
    from tests.rl.agent_helpers import tool_module

    yield from tool_module(monkeypatch, "rl.agent.find")


def test_export_cli_takes_an_agent_configs_world(tmp_path, capsys, find_module):
    from mm.config import load_config
    from rl.agent.config import AgentRunConfig
    from rl.agent.task_export import main

    config = ROOT / "configs/rl/agent_world.yaml"
    assert main(["--config", str(config), "--out", str(tmp_path / "cli"), "--tasks", "2"]) == 0
    assert "2 tasks" in capsys.readouterr().out
    cfg = load_config(AgentRunConfig, config)
    assert cfg.world.detail.tray_spots == 3  # not the default world: the config's is taken
    direct = export_tasks(cfg.world, tmp_path / "direct", "train", 2, zoom=cfg.data.detail_zoom)
    assert (tmp_path / "cli/train.jsonl").read_text() == direct.read_text()
    default = export_tasks(WorldTaskConfig(), tmp_path / "default", "train", 2)
    assert default.read_text() != direct.read_text()


TOOL_MODULE = """
from rl.agent.tools import register_tool


def brightness(task, image):
    return f"mean brightness {task.sources[image - 1].mean():.1f}"


register_tool("brightness", brightness, {
    "type": "object", "properties": {"image": {"type": "integer", "x-image": True}}, "required": ["image"],
}, description="the mean brightness of an image")

OPTIONS = {"scale": float}
CONFIGURED = []


def configure(cfg):
    CONFIGURED.append((cfg.policy.init, cfg.tool_options.get("my_tools", {})))
"""


@pytest.fixture
def own_tools(tmp_path, monkeypatch):
    """A folder with a tool module, as the current folder; the loop's registry restored afterwards."""
    import sys

    from rl.agent.tools import TOOLS

    monkeypatch.setattr(TOOLS, "_tools", dict(TOOLS._tools))
    (tmp_path / "my_tools.py").write_text(TOOL_MODULE)
    (tmp_path / "no_tools.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("my_tools", "no_tools"):
        sys.modules.pop(name, None)


def test_tool_modules_add_users_tools_to_the_demonstrations_and_rollouts(own_tools, capsys):
    from rl.agent.tools import TOOLS, import_tool_modules
    from rl.cli import main

    train, test = _files(own_tools)
    lines = [json.loads(x) for x in train.read_text().splitlines()]
    for rec in lines:  # each demonstration asks its own tool first, then zooms
        rec["demo"] = [{"name": "brightness", "image": 1}, *rec["demo"]]
    train.write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = own_tools / "run"
    args = ["agent", "--config", str(TINY), "--out", str(out), "--set", "sft.steps=2", "grpo.steps=1",
            "eval.n_boot=20", "perception.steps=0", f"data.file={train}", f"eval.file={test}",
            f"policy.spec={ROOT / 'configs/mm/notevlm_tiny.yaml'}"]  # fmt: skip
    assert main(args) == 2  # without the module the file's first call is an unknown tool, before any stage
    assert "demo call 1" in capsys.readouterr().err and "brightness" not in TOOLS
    assert not out.exists()  # nothing written: the fixed command starts afresh
    assert main([*args, "tool_modules=[my_tools]"]) == 0
    assert "brightness" in TOOLS
    rows = [json.loads(x) for x in (out / "eval/tool_sft.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    from rl.agent.loop import instructions

    assert "brightness" in instructions(TOOLS)  # the policy is told about it
    from mm.config import load_config
    from rl.agent.config import AgentRunConfig
    from rl.agent.stages import build_backend, demo_trajectories, train_tasks

    cfg = load_config(AgentRunConfig, out / "config.yaml")
    trajs = demo_trajectories(build_backend(cfg), cfg, train_tasks(cfg)[:2], tools=True)
    assert all(
        [c.call.name for c in t.calls] == ["brightness", "zoom"] and t.n_valid_calls == 2 for t in trajs
    )
    with pytest.raises(UserError, match="registered no tool"):
        import_tool_modules(["no_tools"])
    with pytest.raises(UserError, match="cannot be imported"):
        import_tool_modules(["not_a_module_anywhere"])
    assert import_tool_modules(["my_tools"]) == []  # imported before: nothing new, no error


def test_a_demo_replays_a_users_tool(own_tools):
    from rl.agent.tools import import_tool_modules

    assert import_tool_modules(["my_tools"]) == ["brightness"]
    path = _write(own_tools, {**GOOD, "image": "a.png", "demo": [{"name": "brightness", "image": 1}]})
    Image.fromarray(np.full((4, 4, 3), 10, np.uint8)).save(own_tools / "a.png")
    (task,) = read_task_file(path)
    turns = qa_demo(task, loop_observation)
    assert [t.role for t in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[2].text == "mean brightness 10.0" and turns[3].text == "red"


def test_agent_eval_scores_a_model_on_a_task_file_without_training(tmp_path, capsys):
    """``rl agent-eval`` on an exported policy: the rows equal the training run's eval of the same model,
    and a bad task file is one error line."""
    from rl.cli import main

    train, test = _files(tmp_path)
    out = tmp_path / "run"
    args = ["agent", "--config", str(TINY), "--out", str(out), "--set", "sft.steps=2", "grpo.steps=1",
            "eval.n_boot=20", "perception.steps=0", f"data.file={train}", f"eval.file={test}"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    rows = tmp_path / "rows.jsonl"
    loop = ["--max-turns", "4", "--max-new-tokens", "64", "--max-tokens", "128", "--max-length", "1024"]
    argv = ["agent-eval", "--model", str(out / "export/tool_grpo"), "--tasks", str(test), *loop]
    assert main([*argv, "--rows-out", str(rows), "--json", "--n-boot", "20"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 3 and "accuracy/qa" in result["metrics"]
    assert rows.read_text() == (out / "eval/tool_grpo.jsonl").read_text()  # the run's own eval, again
    cache = ["--image-cache", str(tmp_path / "cache"), "--device", "cpu", "--dtype", "float32"]
    assert main([*argv, *cache, "--rows-out", str(rows), "--n-boot", "20"]) == 0
    assert rows.read_text() == (out / "eval/tool_grpo.jsonl").read_text()  # mapped images: the same rows
    assert len(list((tmp_path / "cache").glob("*.npy"))) > 0
    assert main([*argv, "--no-tools", "--n-boot", "20"]) == 0
    assert "accuracy/qa" in capsys.readouterr().out
    assert main([*argv, "--counts", "--n-boot", "20"]) == 0  # decode.counts: answers copy the tools' counts
    assert "accuracy/qa" in capsys.readouterr().out
    # against a baseline: the same model with tools gains exactly nothing; the paired gain over the model
    # without tools is the difference of the two evals' accuracies
    assert main([*argv, "--baseline", argv[2], "--json", "--n-boot", "20"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["gains"]["accuracy/qa"]["value"] == 0.0 and same["baseline"]["tools"] is True
    assert main([*argv, "--baseline", argv[2], "--baseline-no-tools", "--json", "--n-boot", "20"]) == 0
    vs = json.loads(capsys.readouterr().out)
    acc = vs["metrics"]["accuracy/qa"]["value"] - vs["baseline"]["metrics"]["accuracy/qa"]["value"]
    assert vs["gains"]["accuracy/qa"]["value"] == pytest.approx(acc) and vs["baseline"]["tools"] is False
    assert main([*argv, "--baseline", argv[2], "--baseline-no-tools", "--n-boot", "20"]) == 0
    assert "model - baseline, paired over the same tasks:" in capsys.readouterr().out
    assert main([*argv[:-8], "--tasks", str(tmp_path / "missing.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err


def test_agent_eval_configures_tool_modules_as_rl_agent_does(own_tools, capsys):
    """``--tool-options`` reach a module's ``configure`` with ``--tools-start`` (default ``--model``) as the
    policy's start, checked against its ``OPTIONS``; bad options are one error line before a model loads."""
    import argparse
    import sys

    from mm.errors import UserError
    from rl.agent.eval_cli import configure, configure_tools
    from rl.cli import main

    parser = argparse.ArgumentParser()
    configure(parser)
    base = ["--model", "m", "--tasks", "t.jsonl", "--tool-module", "my_tools"]
    configure_tools(parser.parse_args([*base, "--tool-options", "{my_tools: {scale: 2.0}}"]))
    configure_tools(parser.parse_args([*base, "--tools-start", "start"]))
    assert sys.modules["my_tools"].CONFIGURED == [("m", {"scale": 2.0}), ("start", {})]
    for options, message in [
        ("{my_tools: {size: 1.0}}", "has no option 'size'; its options: ['scale']"),
        ("{my_tools: {scale: big}}", "option 'scale' takes a float, got 'big'"),
        ("{other: {}}", "for ['other'], which no --tool-module loads"),
        ("[1, 2]", "give a mapping of module to options"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)):
            configure_tools(parser.parse_args([*base, "--tool-options", options]))
    assert main(["agent-eval", *base, "--tool-options", "{other: {}}"]) == 2
    assert "no --tool-module loads" in capsys.readouterr().err
    for quote, message in [("find", "give TOOL.ARG"), ("nope.x", "tool 'nope', which no loaded module")]:
        assert main(["agent-eval", *base, "--quote", quote]) == 2  # before a model or task file is read
        assert message in capsys.readouterr().err
