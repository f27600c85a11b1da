"""``rl agent``'s ``note_model`` stage: the agent world exported, a note model pretrained, aligned and
fine-tuned on it, and the policy started from that model; sub-stages resume; bad configs are errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mm.config import load_config
from mm.errors import UserError
from rl.agent.config import AgentRunConfig

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"
MM = ROOT / "configs/mm"
TRAIN = "train.steps=2,train.batch_size=4,train.checkpoint_every=1"
NOTE = [
    "note_model.build=true", "note_model.notes=3", "note_model.workers=1",
    f"note_model.pretrain.config={MM / 'pretrain.yaml'}",
    f"note_model.pretrain.overrides=[{TRAIN},data.eval_notes=2]",
    f"note_model.align.config={MM / 'align.yaml'}",
    f"note_model.align.overrides=[{TRAIN},eval.notes=1]",
    f"note_model.sft.config={MM / 'sft.yaml'}",
    f"note_model.sft.overrides=[{TRAIN},eval.notes=1,eval.questions=0,'tasks.kinds=[caption,image_caption,count_answer]']",
]  # fmt: skip
SMALL = ["data.train_tasks=2", "sft.steps=1", "sft.batch_size=2", "grpo.steps=1", "eval.n_boot=20"]


def _cfg(*overrides: str) -> AgentRunConfig:
    return load_config(AgentRunConfig, TINY, [*SMALL, *NOTE, *overrides])


def test_note_model_stage_builds_the_policy_start_and_resumes(tmp_path):
    from rl.agent.note_model import note_configs, run_note_model, starting_from_it, substages
    from rl.agent.stages import build_backend

    cfg = _cfg(
        f"note_model.tune.config={MM / 'sft.yaml'}",
        f"note_model.tune.overrides=[{TRAIN},eval.notes=1,eval.questions=0,train.train_vision=true]",
        f"note_model.phases=[{{config: {MM / 'sft.yaml'}, overrides: [{TRAIN}, eval.notes=1, "
        "eval.questions=0, 'tasks.kinds=[count_answer]']}]",
    )
    root = tmp_path / "note_model"
    result = run_note_model(cfg, root, log=lambda s: None)
    assert substages(cfg) == ("data", "pretrain", "align", "sft", "tune", "phase1")
    assert result["model"] == str(root / "phase1/model") and result["data"]["photo_notes"] >= 3
    for name in substages(cfg):
        assert json.loads((root / name / "done.json").read_text()) == result[name]
    confs = note_configs(cfg, root)  # the wiring: each stage starts from the one before
    assert confs["align"].init.pretrain == str(root / "pretrain") and confs["align"].init.model is None
    assert confs["tune"].init.model == str(root / "sft/model")
    assert confs["phase1"].init.model == str(root / "tune/model") and confs["phase1"].init.pretrain is None
    assert confs["tune"].data.folder == confs["phase1"].data.folder == str(root / "data")
    assert confs["sft"].tasks.kinds == ["caption", "image_caption", "count_answer"]
    assert confs["phase1"].tasks.kinds == ["count_answer"]
    # the policy starts from the tuned note model, weight for weight
    from rl.agent.policy_init import load_policy

    assert starting_from_it(cfg, root).policy.init == result["model"]
    policy = build_backend(starting_from_it(cfg, root))
    saved = load_policy(result["model"], []).model.state_dict()
    mine = policy.adapter.model.state_dict()
    assert saved.keys() == mine.keys() and all(torch.equal(saved[k], mine[k]) for k in saved)
    # a re-run skips every finished sub-stage
    said: list[str] = []
    assert run_note_model(cfg, root, log=said.append) == json.loads(json.dumps(result))
    assert said == [f"[agent] note_model/{n}: done before, skipped" for n in substages(cfg)]


def test_rl_agent_runs_from_the_note_model_it_builds(tmp_path):
    from rl.agent.run import run_agent

    out = tmp_path / "run"
    report = run_agent(_cfg(), out, log=lambda s: None)  # no tune stage: start from sft
    assert report is not None and set(report["metrics"]) == {"notool_sft", "tool_sft", "tool_grpo"}
    note = json.loads((out / "note_model/result.json").read_text())
    assert note["model"] == str(out / "note_model/sft/model")
    assert note["tune"]["skipped"] == "no note_model.tune" and "skipped" not in note["data"]
    assert (out / "note_model/data/done.json").exists()  # the export ran (its seconds round to 0.0 when fast)
    init = torch.load(out / "init/model.pt")
    from rl.agent.policy_init import load_policy

    sft = load_policy(note["model"], []).model.state_dict()
    assert all(torch.equal(init[k], sft[k]) for k in sft)
    skipped = load_config(AgentRunConfig, TINY, SMALL)  # off by default: the stage records that alone
    run_agent(skipped, tmp_path / "plain", log=lambda s: None)
    assert json.loads((tmp_path / "plain/note_model/result.json").read_text())["build"] is False


@pytest.mark.parametrize(
    "override, error, message",
    [
        ("policy.init=runs/x/model", ValueError, "policy.init=null or note_model.build=false"),
        ("note_model.notes=0", ValueError, "note_model.notes"),
        ("note_model.align.config=configs/mm/sft.yaml", UserError, "train.stage align"),
        ("note_model.sft.config=no/such.yaml", UserError, "note_model.sft.config='no/such.yaml' does not"),
        (
            f"note_model.phases=[{{config: {MM / 'align.yaml'}}}]",
            UserError,
            r"phases\[0\].config .* train.stage sft",
        ),
        ("note_model.phases=[{config: x.yaml, steps: 3}]", ValueError, "unknown key"),
    ],
)
def test_bad_note_model_configs_are_errors_before_anything_runs(tmp_path, override, error, message):
    from rl.agent.note_model import run_note_model

    with pytest.raises(error, match=message):
        run_note_model(_cfg(override), tmp_path / "nm", log=lambda s: None)
    assert not (tmp_path / "nm").exists()


def test_a_config_without_a_note_model_section_takes_overrides_on_the_default_stages():
    cfg = load_config(AgentRunConfig, TINY, ["note_model.sft.overrides=[train.steps=2]"])
    assert cfg.note_model.sft.config == "configs/mm/sft.yaml"
    assert cfg.note_model.sft.overrides == ["train.steps=2"]
    assert cfg.note_model.pretrain.config == "configs/mm/pretrain.yaml" and cfg.note_model.tune is None


def test_a_run_folder_from_before_the_stage_resumes_unless_the_stage_is_on(tmp_path):
    from rl.agent.run import check_training_config
    from tests.rl.agent_helpers import recorded_before

    plain = load_config(AgentRunConfig, TINY, SMALL)
    recorded_before(plain, tmp_path, "note_model")
    check_training_config(plain, tmp_path)  # at its default then: resumes
    with pytest.raises(UserError, match="other note_model settings"):
        check_training_config(_cfg(), tmp_path)


def test_a_key_from_before_it_existed_is_taken_at_its_default_and_an_unbuilt_recipe_is_not_compared(tmp_path):
    from rl.agent.run import check_training_config

    plain = load_config(AgentRunConfig, TINY, SMALL)
    check_training_config(plain, tmp_path)
    path = tmp_path / "training_config.json"
    older = json.loads(path.read_text())
    del older["grpo"]["turn_credit"], older["data"]["dialogue_zoom"]  # keys the config gained later
    older["note_model"]["sft"]["overrides"] = ["train.steps=7"]  # a recipe that is not built is not read
    path.write_text(json.dumps(older))
    check_training_config(plain, tmp_path)
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "metrics.jsonl").write_text("{}\n")  # GRPO has trained: its section is kept
    with pytest.raises(UserError, match="other grpo settings"):
        check_training_config(load_config(AgentRunConfig, TINY, [*SMALL, "grpo.turn_credit=1.0"]), tmp_path)


def test_grpo_settings_may_change_until_grpo_or_ppo_has_trained(tmp_path):
    from rl.agent.run import check_training_config

    check_training_config(load_config(AgentRunConfig, TINY, SMALL), tmp_path)
    tuned = load_config(AgentRunConfig, TINY, [*SMALL, "grpo.zoom_reward_weight=0.5"])
    check_training_config(tuned, tmp_path)  # nothing post-trained yet: taken as it is now
    assert json.loads((tmp_path / "training_config.json").read_text())["grpo"]["zoom_reward_weight"] == 0.5
    with pytest.raises(UserError, match="other policy settings"):  # an SFT-side section is still kept
        check_training_config(load_config(AgentRunConfig, TINY, [*SMALL, "policy.seed=3"]), tmp_path)
    for stage in ("grpo", "ppo"):  # PPO takes GRPO's reward: either one trained keeps the section
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "metrics.jsonl").write_text("{}\n")
        with pytest.raises(UserError, match="other grpo settings"):
            check_training_config(load_config(AgentRunConfig, TINY, SMALL), tmp_path)
        (tmp_path / stage / "metrics.jsonl").unlink()


@pytest.mark.slow
def test_two_processes_build_the_note_model_as_one(tmp_path):
    from tests.helpers.launch import launch, one_process, same_weights

    sets = [*SMALL, *NOTE, "perception.steps=0", "perception.check_notes=0", "grpo.tasks_per_step=2"]
    sets = [s.replace("eval.notes=1", "eval.notes=2") for s in sets]
    args = ["agent", "--config", str(TINY), "--set", *sets]
    one_process([*args, "--out", str(tmp_path / "one")])
    proc = launch(ROOT, "torchrun", *args, "--out", str(tmp_path / "two"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("note_model/pretrain: done") == 1  # rank 0 speaks
    one, two = tmp_path / "one/note_model", tmp_path / "two/note_model"
    assert (one / "data/notes.jsonl").read_text() == (two / "data/notes.jsonl").read_text()
    same_weights(one, two, ["align/model/model.safetensors", "sft/model/model.safetensors"])
    for name in ("align", "sft"):
        assert json.loads((two / name / "done.json").read_text())["step"] == 2


def _lagging_worker(rank: int, init: str, root: str) -> None:
    """Both ranks run the note model stage with instant sub-stages; rank 1 lags after each one, so rank 0
    has written the next sub-stage's done.json before rank 1 looks for it."""
    import datetime
    import time

    import torch.distributed as dist

    import rl.agent.note_model as note_model
    import rl.agent.world_export as world_export
    import rl.pipeline_stages as pipeline_stages

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20)
    )
    try:
        world_export.export_world = lambda *a, **k: 3
        pipeline_stages.stage_pretrain = lambda *a, **k: {"stage": "pretrain"}
        pipeline_stages.stage_train = lambda *a, **k: {"stage": "train"}
        if rank == 1:
            shared = note_model.on_rank0

            def late(fn):
                value = shared(fn)
                time.sleep(0.5)
                return value

            note_model.on_rank0 = late
        result = note_model.run_note_model(_cfg(), Path(root), log=lambda s: None)
        Path(root, f"rank{rank}.json").write_text(json.dumps(sorted(result)))
    finally:
        dist.destroy_process_group()


def test_a_lagging_rank_runs_every_sub_stage_rank_0_runs(tmp_path):
    """A rank that looked for a sub-stage's done.json after rank 0 had written it skipped that sub-stage
    and left rank 0 waiting in its broadcast for ever (a hang); every rank now decides before any write."""
    import torch.multiprocessing as mp

    root = tmp_path / "note_model"
    mp.spawn(_lagging_worker, args=(f"file://{tmp_path / 'rendezvous'}", str(root)), nprocs=2, join=True)
    names = ["align", "data", "model", "pretrain", "sft", "tune"]
    for rank in (0, 1):
        assert json.loads((root / f"rank{rank}.json").read_text()) == names
