"""``rl agent`` end to end on a tiny config: the CLI writes its report, an interrupted run resumes to the
same result (a GRPO stage stopped after step k equals an uninterrupted run), bad configs are errors;
simulated dialogues inside the loop; trajectory rewards."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from mm.config import ConfigError, load_config, to_dict
from rl.agent.config import AgentRunConfig
from rl.agent.evaluate import summarise
from rl.agent.scoring import eval_row, first_aim, trajectory_reward, zoom_on_target
from rl.agent.stages import build_backend, demo_trajectories
from rl.agent.world_tasks import WorldTaskConfig, world_task

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"
SMALL = ["data.train_tasks=4", "sft.steps=2", "grpo.steps=3", "grpo.checkpoint_every=1", "eval.n_boot=20"]


def _cfg(*overrides: str) -> AgentRunConfig:
    return load_config(AgentRunConfig, TINY, [*SMALL, *overrides])


@pytest.mark.parametrize("path", sorted((ROOT / "configs/rl").glob("agent*.yaml")), ids=lambda p: p.name)
def test_shipped_agent_configs_load(path):
    cfg = load_config(AgentRunConfig, path)
    assert cfg.sft.steps >= 1 and cfg.grpo.steps >= 1
    if path.name in ("agent_world.yaml", "agent_world_fast.yaml"):
        # the note-model recipe: the world and demonstrations it was measured with
        assert cfg.world.detail.tray_spots == 3 and cfg.data.change_zoom == "compare"
        assert cfg.data.detail_zoom == cfg.data.caption_zoom == cfg.data.dialogue_zoom == "find"
        assert cfg.decode.quote == {"find": ["object"]}  # the asked thing quoted from the question
        assert cfg.decode.counts and cfg.tool_options == {"rl.agent.find": {"labels": True, "group": True}}


def test_fast_world_recipe_is_agent_world_with_fewer_steps():
    """agent_world_fast.yaml differs from agent_world.yaml only in the settings its header lists."""
    full = to_dict(load_config(AgentRunConfig, ROOT / "configs/rl/agent_world.yaml"))
    fast = to_dict(load_config(AgentRunConfig, ROOT / "configs/rl/agent_world_fast.yaml"))
    differ = {  # (section, key): (agent_world.yaml, agent_world_fast.yaml)
        ("note_model", "notes"): (8000, 5000),
        ("data", "train_tasks"): (2048, 1024),
        ("data", "mix"): (
            [*["detail"] * 6, "change", "caption", "dialogue"],
            [*["detail"] * 5, "change", "change", "caption", "dialogue"],
        ),
        ("sft", "steps"): (800, 400),
        ("sft", "lead_steps"): (200, 100),
        ("grpo", "steps"): (40, 24),
    }
    for (section, key), values in differ.items():
        assert (full[section].pop(key), fast[section].pop(key)) == values, (section, key)
    stages = {  # note model stage: (its overrides in agent_world.yaml, in agent_world_fast.yaml) that differ
        "pretrain": (["train.steps=9000"], ["train.steps=6000", "optim.lr=0.004"]),
        "sft": (["train.steps=3000"], ["train.steps=700"]),
        "tune": (["train.steps=1000"], ["train.steps=300"]),
    }
    for stage, (mine, theirs) in stages.items():
        a, b = full["note_model"].pop(stage)["overrides"], fast["note_model"].pop(stage)["overrides"]
        assert set(mine) <= set(a) and set(theirs) <= set(b), stage
        assert [x for x in a if x not in mine] == [x for x in b if x not in theirs], stage
    assert fast == full


def test_cli_runs_end_to_end(tmp_path, capsys):
    from rl.cli import main

    out = tmp_path / "run"
    assert main(["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL]) == 0
    assert "targets held" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert set(report["metrics"]) == {"notool_sft", "tool_sft", "tool_grpo"}
    for name in ("accuracy/detail", "accuracy/change", "goal_reached"):
        m = report["metrics"]["tool_grpo"][name]
        assert 0.0 <= m["low"] <= m["value"] <= m["high"] <= 1.0
    assert [t["metric"] for t in report["targets"]][:2] == ["accuracy/detail", "accuracy/change"]
    # the last target is the run's wall time: the sum of its stage times, against 20 minutes
    wall = report["targets"][-1]
    assert wall["metric"] == "wall_seconds" and wall["test"] == "<= 1200"
    assert set(report["stage_seconds"]) >= {"init", "sft_tool", "sft_notool", "grpo", "eval"}
    assert wall["value"] == pytest.approx(sum(report["stage_seconds"].values()), abs=0.1)
    assert wall["held"] is (wall["value"] <= 1200)  # the verdict follows the value (no timing asserted)
    assert "| accuracy/change |" in (out / "report.md").read_text()
    assert "[policy 1]" in (out / "transcripts.md").read_text()
    assert (out / "sft.png").stat().st_size > 0 and (out / "grpo.png").stat().st_size > 0
    rows = [json.loads(x) for x in (out / "eval/tool_grpo.jsonl").read_text().splitlines()]
    assert sorted({r["kind"] for r in rows}) == ["caption", "change", "detail", "dialogue"]
    # a re-run finds every stage done and changes nothing
    before = (out / "report.json").read_text()
    assert main(["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL]) == 0
    assert "done before, skipped" in capsys.readouterr().out
    assert (out / "report.json").read_text() == before
    # rows deleted to be redone: the eval runs again and the report is rewritten from the new rows
    rows_before = (out / "eval/tool_grpo.jsonl").read_text()
    for path in (out / "eval").glob("*.jsonl"):
        path.unlink()
    (out / "report.md").write_text("stale")
    assert main(["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL]) == 0
    log = capsys.readouterr().out
    assert "grpo: done before, skipped" in log and "eval: done in" in log and "report: done in" in log
    assert (out / "eval/tool_grpo.jsonl").read_text() == rows_before
    again = json.loads((out / "report.json").read_text())
    assert again.pop("stage_seconds")["eval"] > 0 and "| accuracy/change |" in (out / "report.md").read_text()
    old = {k: v for k, v in json.loads(before).items() if k != "stage_seconds"}
    # every figure is the same but the time the eval took again
    assert again["targets"].pop()["metric"] == old["targets"].pop()["metric"] == "wall_seconds"
    assert again == old
    before = (out / "report.json").read_text()
    # a resume with other training settings is refused; --no-resume starts over
    assert main(["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL, "sft.lr=0.5"]) == 2
    assert "other sft settings" in capsys.readouterr().err
    assert (out / "report.json").read_text() == before and "lr: 0.5" not in (out / "config.yaml").read_text()


@pytest.mark.parametrize(
    "family",
    ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "internvl", "idefics3", "smolvlm", "llava_next"],
)
def test_cli_runs_a_transformers_family_end_to_end(family, tmp_path, capsys):
    """``policy.init`` a saved transformers model: every stage, the report and a resume, as for NoteVLM
    (Qwen2-VL: image rows flat over the batch with M-RoPE; Idefics3: tiles padded per row; LLaVA-NeXT:
    patches padded per image, with image_sizes)."""
    from rl.cli import main
    from tests.mm.adapter_helpers import build_family

    folder = build_family(family, tmp_path / family)
    out = tmp_path / "run"
    args = ["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL, f"policy.init={folder}"]
    args += ["policy.overrides=[]", "rollout.max_new_tokens=16", "rollout.max_tokens=32"]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["metrics"]) == {"notool_sft", "tool_sft", "tool_grpo"}
    assert json.loads((out / "init/result.json").read_text())["family"] == family
    rows = [json.loads(x) for x in (out / "eval/tool_grpo.jsonl").read_text().splitlines()]
    assert sorted({r["kind"] for r in rows}) == ["caption", "change", "detail", "dialogue"]
    assert main(args) == 0 and "grpo: done before, skipped" in capsys.readouterr().out
    # the trained policy is a folder transformers loads alone, with the GRPO stage's weights
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(out / "export/tool_grpo")
    trained = torch.load(out / "grpo/model.pt", weights_only=True)
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items() if k in trained)
    assert len(trained.keys() & model.state_dict().keys()) > 0.9 * len(trained)


def _rows_there(out: Path, models, text: str) -> None:
    """Eval rows of every model, there from before."""
    (out / "eval").mkdir(exist_ok=True)
    for name in models:
        (out / "eval" / f"{name}.jsonl").write_text(text)


FOUR = '{"kind": "detail"}\n' * 4
"""The rows of one model under ``_cfg()``: one task of each of the four kinds, one seed."""


def test_an_eval_with_equal_rows_and_seconds_still_marks_the_report_stale(tmp_path):
    """Two evals of the same models give equal rows, and on a fast machine equal rounded seconds; the
    report written from the first must still count as stale after the second."""
    from rl.agent.run import _done, _eval, _eval_stamp, models_of, write_result

    cfg = _cfg()
    models = models_of(cfg)
    _rows_there(tmp_path, models, FOUR)  # _eval reads them and evaluates nothing
    first = {**_eval(cfg, tmp_path, tmp_path / "eval"), "seconds": 0.4}
    write_result(tmp_path, "eval", first)
    write_result(tmp_path, "report", {"models": list(models), "eval": _eval_stamp(tmp_path)})
    assert _done(tmp_path, "report", cfg)
    second = {**_eval(cfg, tmp_path, tmp_path / "eval"), "seconds": 0.4}
    assert {k: v for k, v in second.items() if k != "id"} == {k: v for k, v in first.items() if k != "id"}
    write_result(tmp_path, "eval", second)
    assert not _done(tmp_path, "report", cfg)


def test_other_eval_settings_redo_the_eval_and_another_n_boot_the_report(tmp_path, monkeypatch):
    """Rows made with other eval settings are never reused: a finished eval counts as not done, and the
    eval drops every model's old rows before it runs; ``n_boot`` touches only the report."""
    from rl.agent.run import _done, _eval, _eval_stamp, models_of, write_result

    cfg = _cfg()
    models = models_of(cfg)
    _rows_there(tmp_path, models, FOUR)
    write_result(tmp_path, "eval", _eval(cfg, tmp_path, tmp_path / "eval"))
    write_result(tmp_path, "report", {"models": list(models), "eval": _eval_stamp(tmp_path), "n_boot": 20})
    assert _done(tmp_path, "eval", cfg) and _done(tmp_path, "report", cfg)
    for changed in ("eval.start=100", "eval.tasks_per_kind=5", "eval.seeds=[0,1]", "eval.split=train"):
        assert not _done(tmp_path, "eval", _cfg(changed)), changed
    more_boot = _cfg("eval.n_boot=50")
    assert _done(tmp_path, "eval", more_boot) and not _done(tmp_path, "report", more_boot)
    # the eval under other settings removes the stale rows first, then evaluates every model (stubbed here:
    # which model folders it would load)
    import rl.agent.run as run

    evaluated = []

    def eval_model(model_path, cfg, tools, transcripts):
        evaluated.append(model_path.parent.name)
        return [], []

    monkeypatch.setattr(run, "build_backend", lambda cfg, path=None: path)
    monkeypatch.setattr(run, "eval_model", eval_model)
    _eval(_cfg("eval.start=100"), tmp_path, tmp_path / "eval")
    assert sorted(evaluated) == sorted(stage for stage, _ in models.values())
    assert all((tmp_path / "eval" / f"{name}.jsonl").read_text() == "" for name in models)
    settings = json.loads((tmp_path / "eval" / "settings.json").read_text())
    assert settings["start"] == 100 and "n_boot" not in settings


def test_a_run_from_before_the_settings_record_is_judged_by_its_seeds_and_row_counts(tmp_path, monkeypatch):
    from rl.agent.run import _done, models_of, result_path, write_result

    cfg = _cfg("eval.tasks_per_kind=2")
    models = models_of(cfg)
    _rows_there(tmp_path, models, "")
    write_result(tmp_path, "eval", {"rows": {m: 2 * len(cfg.data.kinds) for m in models}, "seeds": [0]})
    assert _done(tmp_path, "eval", cfg)
    assert not _done(tmp_path, "eval", _cfg("eval.tasks_per_kind=3"))
    assert not _done(tmp_path, "eval", _cfg("eval.tasks_per_kind=2", "eval.seeds=[1]"))
    # a report of that time (no eval stamp) is stale once the eval's result is newer
    import os

    write_result(tmp_path, "report", {"models": list(models)})
    assert _done(tmp_path, "report", cfg)
    later = result_path(tmp_path, "report").stat().st_mtime + 5
    os.utime(result_path(tmp_path, "eval"), (later, later))
    assert not _done(tmp_path, "report", cfg)
    # and its rows are not reused by an eval with more tasks
    import rl.agent.run as run

    monkeypatch.setattr(run, "build_backend", lambda cfg, path=None: path)
    monkeypatch.setattr(
        run, "eval_model", lambda backend, cfg, tools, transcripts: ([{"kind": "detail"}], [])
    )
    assert set(run._eval(_cfg("eval.tasks_per_kind=3"), tmp_path, tmp_path / "eval")["rows"].values()) == {1}


def test_rows_of_another_count_are_evaluated_again(tmp_path, monkeypatch):
    """Rows there with the same settings but not as many as they make (an eval cut short, rows copied
    from another eval) are redone; a model with the full count is kept."""
    import rl.agent.run as run

    cfg = _cfg()
    stages = run.models_of(cfg)  # model name -> (stage, tools)
    models = list(stages)
    _rows_there(tmp_path, models, FOUR)
    (tmp_path / "eval" / f"{models[0]}.jsonl").write_text(FOUR[: len(FOUR) // 2])  # 2 rows of 4
    (tmp_path / "eval" / "settings.json").write_text(json.dumps(run.row_settings(cfg)))
    evaluated = []

    def eval_model(model_path, cfg, tools, transcripts):
        evaluated.append(model_path.parent.name)
        return [{"kind": "detail"}] * 4, []

    monkeypatch.setattr(run, "build_backend", lambda cfg, path=None: path)
    monkeypatch.setattr(run, "eval_model", eval_model)
    result = run._eval(cfg, tmp_path, tmp_path / "eval")
    assert evaluated == [stages[models[0]][0]]
    assert result["rows"] == {m: 4 for m in models}


def test_grpo_stopped_after_step_k_and_resumed_equals_uninterrupted(tmp_path):
    from rl.agent.run import run_agent

    cfg = _cfg()
    whole = run_agent(cfg, tmp_path / "whole", log=lambda s: None)
    assert run_agent(cfg, tmp_path / "cut", log=lambda s: None, grpo_stop_after=1) is None
    cut = tmp_path / "cut"
    assert not (cut / "grpo/result.json").exists() and (cut / "grpo/checkpoint.pt").exists()
    assert len((cut / "grpo/metrics.jsonl").read_text().splitlines()) == 1
    resumed = run_agent(cfg, cut, log=lambda s: None)
    a = (tmp_path / "whole/grpo/metrics.jsonl").read_text().splitlines()
    b = (cut / "grpo/metrics.jsonl").read_text().splitlines()
    assert len(a) == 3 and a == b  # every metric of every step equal
    assert resumed["metrics"] == whole["metrics"]
    for name in ("tool_grpo", "notool_sft"):
        assert (cut / f"eval/{name}.jsonl").read_text() == (tmp_path / f"whole/eval/{name}.jsonl").read_text()


@pytest.mark.parametrize(
    "override, message",
    [
        ("grpo.bogus=1", "bogus"),
        ("data.kinds=[detail,poem]", "data.kinds"),
        ("grpo.group_size=1", "group_size"),
        ("eval.seeds=[]", "seeds"),
        ("sft.steps=0", "sft.steps"),
        ("grpo.scale=wide", "grpo.scale"),
        ("data.dialogue_recovery=1.5", "dialogue_recovery"),
        ("sft.call_weight=0", "sft.call_weight"),
        ("sft.schedule=linear", "sft.schedule must be one of"),
        ("sft.lead_steps=1", "sft.lead_kinds given exactly when"),
        ("sft.lead_kinds=[detail]", "sft.lead_kinds given exactly when"),
        ("sft.lead_steps=2 sft.lead_kinds=[detail]", "below sft.steps"),
        ("sft.lead_steps=1 sft.lead_kinds=[poem]", "not among data.kinds"),
        ("sft.warmup_steps=2", "sft.warmup_steps must be >= 0 and below sft.steps"),
        ("data.mix=[detail,change]", "data.mix must name each of data.kinds"),
        ("data.mix=[detail,detail,change,caption,dialogue,poem]", "data.mix"),
    ],
)
def test_bad_config_is_an_error(override, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        _cfg(*override.split())


def test_dialogue_demo_runs_against_the_simulator_with_user_turns_masked():
    cfg = _cfg("rollout.max_new_tokens=128", "rollout.max_tokens=512", "rollout.max_turns=8")
    backend = build_backend(cfg)
    task = world_task(WorldTaskConfig(seed=0), "dialogue", 0)
    (traj,) = demo_trajectories(backend, cfg, [task], tools=True)
    assert traj.satisfied is True and traj.truncation is None and traj.user_turns[-1].done
    assert all(c.valid for c in traj.calls) and len(traj.calls) >= 1
    assert len(traj.user_turns) == len(traj.replies) >= 2
    text_of = [backend.decode(traj.ids[s:e]) for kind, s, e in traj.spans if kind == "observation"]
    users = [t for t in text_of if t.startswith("\n<user>")]
    assert len(users) == len(traj.user_turns) - 1  # the last reply ends the dialogue
    for kind, s, e in traj.spans:
        assert set(traj.response_mask[s:e]) == ({1} if kind == "policy" else {0})
    assert eval_row(traj, 0)["goal_reached"] == 1.0 and eval_row(traj, 0)["correct"] == 1.0
    # the no-tool baseline's demonstration: the same replies, no calls
    (plain,) = demo_trajectories(backend, cfg, [task], tools=False)
    assert plain.calls == [] and plain.replies == traj.replies and plain.satisfied


def test_recovery_demo_keeps_its_mistake_in_context_and_out_of_the_loss():
    import torch

    from rl.agent.loop import trajectory_batch
    from rl.agent.train import sft_loss

    patient = ["rollout.user_patience=2", "rollout.user_max_turns=4"]
    cfg = _cfg("rollout.max_new_tokens=128", "rollout.max_tokens=512", "rollout.max_turns=8",
               "data.dialogue_recovery=1.0", *patient)  # fmt: skip
    backend = build_backend(cfg)
    task = world_task(WorldTaskConfig(seed=0), "dialogue", 3)  # two zooms and a wrong reply, then recovery
    (traj,) = demo_trajectories(backend, cfg, [task], tools=True)
    assert traj.satisfied is True and all(c.valid for c in traj.calls)
    assert traj.user_turns[0].score < 1.0 and not traj.user_turns[0].done  # the user objected
    policy = [(s, e) for kind, s, e in traj.spans if kind == "policy"]
    assert len(policy) == len(traj.turns) and traj.turns[2].startswith("They are")
    for k, (s, e) in enumerate(policy):  # the first three turns (two zooms, the wrong reply) are context
        assert set(traj.train_mask[s:e]) == ({0} if k < 3 else {1}) and set(traj.response_mask[s:e]) == {1}
    assert [m for m, r in zip(traj.train_mask, traj.response_mask) if not r] == [0] * (len(traj.ids) - sum(
        traj.response_mask))  # fmt: skip
    batch, _ = trajectory_batch(backend, [traj])
    with torch.no_grad():
        logps, _ = backend.adapter.token_logps(batch)  # (1, T)
        train = torch.tensor(traj.train_mask, dtype=logps.dtype)[None]
        want = -(logps * train).sum() / train.sum()
        torch.testing.assert_close(sft_loss(backend, [traj]), want, atol=1e-6, rtol=0)
        everything = -(logps * batch["response_mask"]).sum() / batch["response_mask"].sum()
        assert abs(float(want - everything)) > 1e-3
    (plain,) = demo_trajectories(backend, cfg, [task], tools=False)  # no tools: only the wrong reply masked
    assert plain.calls == [] and plain.satisfied and plain.turns[0] == traj.turns[2]
    first = next((s, e) for kind, s, e in plain.spans if kind == "policy")
    assert set(plain.train_mask[first[0] : first[1]]) == {0}
    assert sum(plain.train_mask) == sum(plain.response_mask) - (first[1] - first[0])
    # the tiny config's user (patience 1, 2 replies) cannot hear a mistake and both slots
    impatient = _cfg("data.dialogue_recovery=1.0")
    with pytest.raises(ValueError, match="user_max_turns"):
        demo_trajectories(build_backend(impatient), impatient, [task], tools=True)


def test_trajectory_reward_of_demonstrations_and_penalties():
    cfg = _cfg("rollout.max_new_tokens=160", "rollout.max_tokens=512")
    backend = build_backend(cfg)
    world = WorldTaskConfig(seed=0)
    tasks = [world_task(world, kind, 1) for kind in ("detail", "change", "caption")]
    trajs = demo_trajectories(backend, cfg, tasks, tools=True)
    kw = {"invalid_call_penalty": 0.25, "hallucination_weight": 0.5, "turn_reward_weight": 0.0}
    assert [trajectory_reward(t, **kw) for t in trajs] == pytest.approx([1.0, 1.0, 1.0])
    # the detail demo zooms on its tray: +0.5 with the zoom term; a change task names no place
    assert trajectory_reward(trajs[0], **kw, zoom_reward_weight=0.5) == pytest.approx(1.5)
    assert trajectory_reward(trajs[1], **kw, zoom_reward_weight=0.5) == pytest.approx(1.0)
    from rl.agent.parse import ParseError
    from rl.agent.trajectory import CallRecord

    trajs[0].calls.append(CallRecord(9, ParseError("malformed_json", "x"), "error: x"))
    assert trajectory_reward(trajs[0], **kw) == pytest.approx(0.75)
    trajs[0].answer, trajs[0].truncation = None, "turn_tokens"  # no answer: score 0, the call and the cut
    assert trajectory_reward(trajs[0], **kw, truncation_penalty=0.5) == pytest.approx(-0.75)
    assert trajectory_reward(trajs[0], **kw) == pytest.approx(-0.25)
    # the crab is purple and there is one umbrella: 1 of 1 attribute and 1 of 1 count claims are false;
    # F1 = 2 * (2/4) * (2/10) / (2/4 + 2/10) = 2/7, minus 0.5 x 2/2
    trajs[2].answer = "The photo shows a medium green crab. On the tray are three tiny umbrellas."
    assert trajectory_reward(trajs[2], **kw) == pytest.approx(2 / 7 - 0.5)
    # the count term: 1 of 1 count claims false, on top
    assert trajectory_reward(trajs[2], **kw, count_weight=0.75) == pytest.approx(2 / 7 - 0.5 - 0.75)
    trajs[2].answer = "The photo shows a medium green crab. On the tray are tiny umbrellas."  # no count claim
    assert trajectory_reward(trajs[2], **kw, count_weight=0.75) == trajectory_reward(trajs[2], **kw)


def test_zoom_on_target_judges_the_first_zoom_against_the_answer_box():
    import copy
    from dataclasses import replace

    from rl.agent.parse import ParseError, ToolCall
    from rl.agent.trajectory import CallRecord

    cfg = _cfg("rollout.max_new_tokens=160", "rollout.max_tokens=512")
    backend = build_backend(cfg)
    world = WorldTaskConfig(seed=0)
    detail, change = (world_task(world, kind, 1) for kind in ("detail", "change"))
    traj, other = demo_trajectories(backend, cfg, [detail, change], tools=True)
    assert zoom_on_target(traj) == 1.0 and eval_row(traj, 0)["zoom_on_target"] == 1.0  # the tray demo
    assert eval_row(traj, 0)["aim"] == "on_target"
    assert zoom_on_target(other) is None and "zoom_on_target" not in eval_row(other, 0)  # no asked box
    assert first_aim(other) is None and "aim" not in eval_row(other, 0)
    metrics = summarise([eval_row(traj, 0), eval_row(other, 0)], n_boot=20)
    assert metrics["zoom_on_target/detail"]["value"] == 1.0 and "zoom_on_target/change" not in metrics

    def first(image, box, *, task_box=(100, 100, 140, 140), calls=(), where=None):
        t = copy.copy(traj)
        t.task = replace(detail, meta=dict(detail.meta, box=list(task_box)))
        t.calls = [*calls, CallRecord(1, ToolCall("zoom", {"image": image, "box": box}), "zoom")]
        if where is not None:
            assert first_aim(t) == where
        return zoom_on_target(t)

    S = detail.sources[detail.meta["image"] - 1].shape[1]
    k = detail.meta["image"]
    # target [100, 140) x [100, 140): a crop of [100, 120) x [100, 140) holds exactly half of it, one column
    # less holds 19/40
    assert first(k, [100 / S, 100 / S, 120 / S, 140 / S], where="on_target") == 1.0
    assert first(k, [100 / S, 100 / S, 119 / S, 140 / S], where="other_place") == 0.0
    assert first(k, [0.0, 0.0, 0.9, 0.9]) == 1.0
    assert first(k + 1, [0.0, 0.0, 0.9, 0.9], where="other_photo") == 0.0  # another photo
    assert first(k, [0.0, 0.0, 99 / S, 99 / S], where="other_place") == 0.0
    bad = CallRecord(0, ParseError("malformed_json", "x"), "error: x")
    assert first(k, [0.0, 0.0, 0.9, 0.9], calls=[bad]) == 1.0  # the first *valid* call counts
    compare = CallRecord(0, ToolCall("compare", {"images": [1, 2]}), "compare")
    assert first(k, [0.0, 0.0, 0.9, 0.9], calls=[compare], where="no_zoom") == 0.0
    # a zoom on a whole photo looks at it again and aims at nothing: passed over, alone it is no aim
    look = CallRecord(0, ToolCall("zoom", {"image": k + 1, "box": [0.0, 0.0, 1.0, 1.0]}), "zoom")
    assert first(k, [100 / S, 100 / S, 120 / S, 140 / S], calls=[look]) == 1.0
    assert first(k, [0.0, 0.0, 1.0, 1.0], where="no_zoom") == 0.0
    t = copy.copy(traj)
    t.calls = []
    assert zoom_on_target(t) == 0.0 and first_aim(t) == "no_zoom"

    def found(args, thing=detail.meta["object"]):
        t = copy.copy(traj)
        t.task = replace(detail, meta=dict(detail.meta, object=thing))
        t.calls = [CallRecord(1, ToolCall("find", args), "find")]
        return first_aim(t)

    # a find aims by what it asks: the asked thing (singular or plural) on the asked photo, or on every one
    assert found({"image": k, "object": "the tiny cups"}, "cup") == "on_target"
    assert found({"image": k, "object": "cup"}, "cup") == found({"object": "tiny cup"}, "cup") == "on_target"
    assert found({"image": k, "object": "the tiny cupboards"}, "cup") == "other_thing"
    assert found({"image": k + 1, "object": "the tiny cups"}, "cup") == "other_photo"
    assert found({"image": k, "object": "tiny"}, None) == "on_target"  # a task that names no thing
    assert found({"image": k, "object": "cup", "box": [100 / S, 100 / S, 119 / S, 140 / S]}) == "other_place"


def test_policy_init_takes_a_model_folder(tmp_path):
    import torch

    from rl.agent.stages import run_sft

    cfg = _cfg()
    backend = build_backend(cfg)
    folder = tmp_path / "model"
    backend.adapter.model.save_pretrained(str(folder))
    backend.adapter.processor.save_pretrained(folder)
    cfg = _cfg(f"policy.init={folder}", "data.train_tasks=2", "sft.steps=1", "sft.batch_size=2")
    loaded = build_backend(cfg)
    assert loaded.adapter.family == "notevlm"
    mine, theirs = backend.adapter.model.state_dict(), loaded.adapter.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    torch.save(theirs, tmp_path / "init.pt")
    (tmp_path / "sft").mkdir()
    result = run_sft(cfg, tmp_path / "sft", tmp_path / "init.pt", tools=True, stage="sft_tool")
    assert result["demos"] == 2 and result["final_loss"] > 0 and (tmp_path / "sft/model.pt").exists()


@pytest.mark.parametrize(
    "schedule, warmup, factors",
    [
        ("constant", 0, [1.0] * 4),
        ("cosine", 0, [1.0, 0.5 + 0.5 * 2**-0.5, 0.5, 0.5 - 0.5 * 2**-0.5]),  # (1 + cos(pi t)) / 2, t = k/4
        ("cosine", 2, [0.5, 1.0, 1.0, 0.5]),  # warm-up 1/2, 2/2; then t = 0, 1/2
    ],
)
def test_sft_schedule_multiplies_lr_per_step(schedule, warmup, factors):
    from rl.agent.stages import sft_schedule

    s = _cfg("sft.steps=4", "sft.lr=0.01", f"sft.schedule={schedule}", f"sft.warmup_steps={warmup}").sft
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=s.lr)
    scheduler, lrs = sft_schedule(optimizer, s), []
    for _ in range(s.steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.01 * f for f in factors], abs=1e-12)


def test_sft_stage_logs_the_scheduled_lr(tmp_path):
    from rl.agent.stages import run_sft

    cfg = _cfg("data.train_tasks=2", "sft.steps=4", "sft.batch_size=1", "sft.log_every=1", "sft.lr=0.01",
               "sft.schedule=cosine")  # fmt: skip
    torch.save(build_backend(cfg).adapter.model.state_dict(), tmp_path / "init.pt")
    (tmp_path / "sft").mkdir()
    run_sft(cfg, tmp_path / "sft", tmp_path / "init.pt", tools=True, stage="sft_tool")
    rows = [json.loads(x) for x in (tmp_path / "sft/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["lr"] for r in rows] == pytest.approx([0.01, 0.00853553, 0.005, 0.00146447], abs=1e-8)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # the optimizer step is stubbed out
def test_sft_lead_draws_the_first_steps_from_the_lead_kinds(tmp_path, monkeypatch):
    import rl.agent.stages as stages

    kinds = []
    monkeypatch.setattr(
        stages,
        "sft_step",
        lambda backend, opt, batch, **kw: (kinds.append([t.task.kind for t in batch]), (1.0, 0.0))[1],
    )
    cfg = _cfg(
        "data.train_tasks=8", "sft.steps=6", "sft.batch_size=2", "sft.lead_steps=4", "sft.lead_kinds=[detail]"
    )
    torch.save(build_backend(cfg).adapter.model.state_dict(), tmp_path / "init.pt")
    (tmp_path / "sft").mkdir()
    stages.run_sft(cfg, tmp_path / "sft", tmp_path / "init.pt", tools=True, stage="sft_tool")
    assert len(kinds) == 6 and all(k == ["detail"] * 2 for k in kinds[:4])  # the two detail tasks, in turn
    assert {k for batch in kinds[4:] for k in batch} - {"detail"}  # then from every kind


def test_stage_seconds_count_the_note_model_sub_stages(tmp_path):
    from rl.agent.report import stage_seconds

    def done(stage: str, result: dict) -> None:
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "result.json").write_text(json.dumps(result))

    done("note_model", {"model": "m", "data": {"seconds": 60.5}, "pretrain": {"seconds": 300.0, "step": 9}})
    done("sft_tool", {"seconds": 200.25})
    done("eval", {"seconds": 50.0})
    assert stage_seconds(tmp_path) == {"note_model": 360.5, "sft_tool": 200.25, "eval": 50.0}
    # a run from policy.init builds no note model: no time listed for it
    (tmp_path / "note_model" / "result.json").write_text(json.dumps({"build": False, "seconds": 0.0}))
    assert stage_seconds(tmp_path) == {"sft_tool": 200.25, "eval": 50.0}


def test_data_mix_weights_the_training_kinds_not_the_eval():
    from rl.agent.evaluate import heldout_tasks
    from rl.agent.stages import train_tasks

    cfg = _cfg("data.mix=[detail,detail,change,caption,dialogue]", "data.train_tasks=10")
    assert [t.kind for t in train_tasks(cfg)] == ["detail", "detail", "change", "caption", "dialogue"] * 2
    assert Counter(t.kind for t in heldout_tasks(cfg, 0)) == Counter(_cfg().data.kinds)  # one of each


def test_train_tasks_render_once_per_world_and_mix_read_only():
    from rl.agent.stages import train_tasks
    from rl.agent.world_tasks import mixed_tasks

    cfg = _cfg("data.train_tasks=6")
    first, again = train_tasks(cfg), train_tasks(cfg)
    assert [id(t) for t in first] == [id(t) for t in again]  # the next stage's tasks: not rendered again
    fresh = list(mixed_tasks(cfg.world, "train", 6, tuple(cfg.data.kinds)))
    assert [t.task_id for t in first] == [t.task_id for t in fresh]
    assert all(np.array_equal(a, b) for t, f in zip(first, fresh) for a, b in zip(t.sources, f.sources))
    with pytest.raises(ValueError, match="read-only"):  # shared by the stages: nothing may draw into them
        first[0].sources[0][0, 0] = 0
    other = train_tasks(_cfg("data.train_tasks=6", "world.seed=1"))  # another world: rendered for it
    assert other[0] is not first[0] and not np.array_equal(other[0].sources[0], first[0].sources[0])
    assert train_tasks(cfg)[0] is not first[0]  # one set is kept: the first was let go
