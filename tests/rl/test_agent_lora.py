"""``rl agent`` with LoRA, another dtype and a device setting: every stage trains the adapters only and
saves only them, a resumed GRPO equals an uninterrupted one, ``export`` merges them into a complete folder,
and settings that cannot work are one error before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mm.config import load_config
from mm.errors import UserError
from rl.agent.config import AgentRunConfig
from rl.agent.stages import build_backend, save_weights
from rl.agent.weights import load_policy_state, policy_state

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"
SMALL = ["data.train_tasks=4", "sft.steps=2", "grpo.steps=3", "grpo.checkpoint_every=1", "eval.n_boot=20",
         "eval.tasks_per_kind=2"]  # fmt: skip
LORA = ["lora.enabled=true", "lora.r=4", "sft.lr=1e-2", "grpo.lr=1e-2"]


def _cfg(*overrides: str) -> AgentRunConfig:
    return load_config(AgentRunConfig, TINY, [*SMALL, *overrides])


def test_lora_policy_trains_and_saves_the_adapters_only(tmp_path):
    cfg = _cfg(*LORA)
    backend = build_backend(cfg)
    model = backend.adapter.model
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n or "modules_to_save" in n or "image_index" in n for n in trained)
    assert any("lora_A" in n for n in trained)
    state = policy_state(model)
    assert set(state) == set(trained)
    total = sum(p.numel() for p in model.parameters())
    assert sum(v.numel() for v in state.values()) < total / 2
    # a second build is the same policy: the same base, the same fresh adapters
    again = build_backend(cfg).adapter.model
    assert all(torch.equal(v, policy_state(again)[k]) for k, v in state.items())
    save_weights(backend, tmp_path / "model.pt")
    loaded = build_backend(cfg, tmp_path / "model.pt").adapter.model
    assert all(torch.equal(v, policy_state(loaded)[k]) for k, v in state.items())


def test_a_file_of_another_setup_is_refused_not_half_loaded(tmp_path):
    full = build_backend(_cfg())
    save_weights(full, tmp_path / "full.pt")
    with pytest.raises(UserError, match="does not fit this LoRA setup.*was lora or the model changed"):
        build_backend(_cfg(*LORA), tmp_path / "full.pt")
    save_weights(build_backend(_cfg(*LORA)), tmp_path / "lora.pt")
    with pytest.raises(UserError, match="does not fit this one"):
        build_backend(_cfg(), tmp_path / "lora.pt")
    with pytest.raises(UserError, match="does not fit this LoRA setup"):
        build_backend(_cfg(*LORA, "lora.r=2"), tmp_path / "lora.pt")
    model = build_backend(_cfg(*LORA)).adapter.model
    with pytest.raises(UserError, match="unknown"):
        load_policy_state(model, {**policy_state(model), "extra.weight": torch.zeros(1)})


def test_cli_with_lora_end_to_end_resumes_and_exports_merged(tmp_path, capsys):
    from mm.model.adapter import load_adapter
    from rl.agent.run import run_agent

    out = tmp_path / "run"
    cfg = _cfg(*LORA)
    assert run_agent(cfg, out, grpo_stop_after=2) is None  # stopped after GRPO step 2, as a kill would
    report = run_agent(cfg, out)
    assert report is not None and "tool_grpo" in report["metrics"]
    whole = tmp_path / "whole"
    assert run_agent(cfg, whole) is not None
    for stage in ("sft_tool", "grpo"):  # the resumed run equals the uninterrupted one
        a = torch.load(out / stage / "model.pt", weights_only=True)
        b = torch.load(whole / stage / "model.pt", weights_only=True)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # each stage saved the trained tensors only, and training moved them
    init = torch.load(out / "init/model.pt", weights_only=True)
    grpo = torch.load(out / "grpo/model.pt", weights_only=True)
    assert init.keys() == grpo.keys() and all("base_layer" not in k for k in grpo)
    assert any(not torch.equal(init[k], grpo[k]) for k in grpo if "lora_B" in k)
    # export: a complete model folder, the adapters merged (and kept in adapter/)
    folder = out / "export/tool_grpo"
    assert (folder / "adapter/adapter_config.json").is_file()
    merged = load_adapter(str(folder))
    policy = build_backend(cfg, out / "grpo/model.pt").adapter
    samples = [s for s in _probe(policy)]
    with torch.no_grad():
        a, _ = merged.answer_logps(samples, ["a red cup"])
        b, _ = policy.answer_logps(samples, ["a red cup"])
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    # another LoRA rank is another run: refused on resume
    from rl.cli import main

    args = ["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL, *LORA]
    assert main([*args, "policy.device=auto"]) == 0  # where it runs is no change of the run
    assert "grpo: done before, skipped" in capsys.readouterr().out
    assert main([*args, "lora.r=2"]) == 2
    assert "other lora settings" in capsys.readouterr().err


def _probe(adapter):
    from PIL import Image

    from mm.model.adapter import Sample

    image = Image.new("RGB", (64, 64), (200, 30, 30))
    return [Sample(images=[image], text="What is on the table?")]


def test_bfloat16_policy_runs_the_stages(tmp_path):
    from rl.agent.run import run_agent

    cfg = _cfg(*LORA, "policy.dtype=bfloat16", "grpo.steps=1")
    backend = build_backend(cfg)
    frozen = [p for p in backend.adapter.model.parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert run_agent(cfg, tmp_path / "run") is not None
    assert json.loads((tmp_path / "run/report.json").read_text())["metrics"]["tool_grpo"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_a_device_that_is_not_there_is_refused_before_anything_is_written(tmp_path, capsys):
    from rl.cli import main

    out = tmp_path / "run"
    assert (
        main(["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL, "policy.device=cuda"]) == 2
    )
    assert "policy.device=cuda but no CUDA device is visible" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(Exception, match="policy.device must be auto, cpu, cuda or cuda:N"):
        _cfg("policy.device=gpu")
    with pytest.raises(Exception, match="policy.dtype must be one of"):
        _cfg("policy.dtype=int8")


def test_lora_on_a_transformers_family_exports_a_folder_transformers_loads(tmp_path):
    """Qwen2.5-VL with LoRA through every stage: the export is the base with the GRPO adapters merged."""
    from transformers import AutoModelForImageTextToText

    from rl.agent.run import run_agent
    from tests.mm.adapter_helpers import build_family

    folder = build_family("qwen2_5_vl", tmp_path / "qwen2_5_vl")
    cfg = _cfg(*LORA, f"policy.init={folder}", "policy.overrides=[]", "rollout.max_new_tokens=16",
               "rollout.max_tokens=32", "grpo.steps=2")  # fmt: skip
    assert run_agent(cfg, tmp_path / "run", log=lambda _: None) is not None
    trained = torch.load(tmp_path / "run/grpo/model.pt", weights_only=True)
    assert trained and all("lora_" in k for k in trained)
    merged = AutoModelForImageTextToText.from_pretrained(tmp_path / "run/export/tool_grpo").state_dict()
    policy = build_backend(cfg, tmp_path / "run/grpo/model.pt").adapter.model.merge_and_unload().state_dict()
    assert merged.keys() == policy.keys() and all(torch.equal(merged[k], policy[k]) for k in merged)
    base = AutoModelForImageTextToText.from_pretrained(folder).state_dict()
    assert any(not torch.equal(base[k], merged[k]) for k in base if "q_proj" in k)  # the adapters moved it


def test_what_a_multi_process_launch_cannot_run_is_refused_before_anything_is_written(
    tmp_path, capsys, monkeypatch
):
    from rl.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "run"
    args = ["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL]
    assert main([*args, "perception.batch_size=3"]) == 2
    assert "perception.batch_size=3 must divide by the 2 processes" in capsys.readouterr().err
    assert main([*args, "perception.steps=0", "sft.batch_size=3"]) == 2
    assert "sft.batch_size=3 must divide by the 2 processes" in capsys.readouterr().err
    ppo = ["perception.steps=0", "ppo.steps=1", "ppo.tasks_per_step=2", "ppo.samples_per_task=2"]
    assert main([*args, *ppo, "ppo.tasks_per_step=3", "ppo.samples_per_task=4"]) == 2
    assert "ppo.tasks_per_step=3 must divide by the 2 processes" in capsys.readouterr().err
    assert main([*args, *ppo, "ppo.minibatches=3"]) == 2  # a minibatch may lie on one rank; the step's rows
    assert "ppo.minibatches=3 must divide the 4 trajectories of a step" in capsys.readouterr().err
    assert not out.exists()


def test_a_peft_adapter_folder_is_a_policy_to_start_from(tmp_path):
    """policy.init = what TRL writes under LoRA (an adapter folder on a local base): merged on load, then
    trained with fresh adapters of its own."""
    from mm.model.adapter import load_adapter
    from rl.agent.run import run_agent
    from tests.mm.adapter_helpers import build_family

    base = load_adapter(str(build_family("qwen2_vl", tmp_path / "base")))
    base.apply_lora(r=4)
    base.model.save_pretrained(str(tmp_path / "trl_lora"))  # adapter_config.json + adapter_model.safetensors
    cfg = _cfg(*LORA, f"policy.init={tmp_path / 'trl_lora'}", "policy.overrides=[]",
               "rollout.max_new_tokens=16", "rollout.max_tokens=32", "grpo.steps=1")  # fmt: skip
    assert build_backend(cfg).adapter.family == "qwen2_vl"
    assert run_agent(cfg, tmp_path / "run", log=lambda _: None) is not None
    assert (tmp_path / "run/export/tool_grpo/config.json").is_file()
