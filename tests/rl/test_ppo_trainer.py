"""`rl ppo`: short runs of each critic layout and KL mode, resume, the CLI, config errors."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from rl.cli import main
from tests.helpers.eval_model import make_data_dir, make_model_dir

PPO_KEYS = (
    "loss", "grad_norm", "reward_mean", "entropy", "policy_loss", "value_loss", "explained_variance",
    "clip_frac_low", "clip_frac_high", "value_clip_frac", "approx_kl", "response_len", "sampled_tokens",
    "value_mean", "return_mean",
)  # fmt: skip
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rl" / "ppo_tiny.yaml"
BASE = (
    "data.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "train.steps=2",
    "train.checkpoint_every=1", "optim.lr=0.01", "algo.overlong_penalty=true", "algo.overlong_cache=6",
)  # fmt: skip
"""The overlong penalty over the whole length makes the rewards of a random model's captions differ."""


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppo")
    return make_model_dir(root), make_data_dir(root, split="train")


def _run(dirs, out, *sets):
    model, data = dirs
    args = ["ppo", "--config", str(CONFIG), "--out", str(out), "--data", str(data), "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(args + [x for s in (f"init.model={model}", *BASE, *sets) for x in ("--set", s)])


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("critic", ["shared", "separate"])
@pytest.mark.parametrize("kl_mode", ["reward", "loss"])
def test_short_runs_of_each_critic_and_kl_mode(tmp_path, dirs, critic, kl_mode):
    out = tmp_path / "run"
    sets = (f"critic={critic}", f"kl.mode={kl_mode}", "algo.beta=0.05", "algo.kl_estimator=k3")
    assert _run(dirs, out, *sets) == 0
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2]
    for k in (*PPO_KEYS, "kl"):
        assert k in recs[-1] and math.isfinite(recs[-1][k]), k
    assert all(r["kl"] >= 0 for r in recs) and "zero_std_frac" not in recs[-1]  # k3; no group statistics
    if kl_mode == "reward":  # the KL of the rollout: step 1 samples from the reference itself
        assert recs[0]["kl"] == 0.0 and recs[1]["kl"] > 0
    res = json.loads((out / "result.json").read_text())
    assert res["critic"] == critic and res["reference"] == "copy"
    meta = json.loads((out / "value_head.json").read_text())
    assert meta["critic"] == critic and (out / "critic" / "model" / "config.json").is_file() == (
        critic == "separate"
    )
    assert (out / "curves.png").stat().st_size > 1000 and (out / "model" / "config.json").is_file()
    from mm.model import NoteVLMForConditionalGeneration

    a = NoteVLMForConditionalGeneration.from_pretrained(str(dirs[0]))
    b = NoteVLMForConditionalGeneration.from_pretrained(str(out / "model"))
    moved = [n for (n, p), q in zip(a.named_parameters(), b.parameters()) if not torch.equal(p, q)]
    assert moved and not any(n.startswith("vision_tower") for n in moved)


def test_entropy_remedies_and_lora_run(tmp_path, dirs):
    sets = ("algo.loss_mode=clip_cov", "algo.entropy_coef=0.01", "algo.forking_top=0.5", "lora.enabled=true",
            "lora.r=2", "ppo.vf_clip=null", "ppo.whiten_advantages=false")  # fmt: skip
    assert _run(dirs, tmp_path / "rem", *sets) == 0
    r = _records(tmp_path / "rem")[-1]
    assert 0 < r["forking_frac"] <= 0.6 and "clip_cov_frac" in r and r["value_clip_frac"] == 0.0
    assert json.loads((tmp_path / "rem" / "result.json").read_text())["reference"] == "none"


def test_resume_gives_the_same_metrics_and_weights(tmp_path, dirs):
    from safetensors.torch import load_file

    from mm.config import load_config
    from rl.trainers import ppo

    sets = ["train.steps=3", "ppo.epochs=2", "ppo.minibatches=2"]
    assert _run(dirs, tmp_path / "straight", *sets) == 0
    model, data = dirs
    cfg = load_config(ppo.PPOConfig, CONFIG, [f"init.model={model}", f"data.folder={data}", *BASE, *sets])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ppo.train(cfg, out_dir=tmp_path / "killed", show_progress=False, stop_after=1)
    assert _run(dirs, tmp_path / "killed", *sets) == 0
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "step-00000003" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "checkpoints" / "step-00000003" / "model.safetensors"))
    assert "head.weight" in a and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    timing = ("time_s", "cpu_s", "step_s")
    ra, rb = _records(tmp_path / "straight"), _records(tmp_path / "killed")
    assert [{k: v for k, v in r.items() if k not in timing} for r in ra] == [
        {k: v for k, v in r.items() if k not in timing} for r in rb
    ]


@pytest.mark.parametrize(
    "override, message",
    [
        ("ppo.vf_clip=-0.1", "ppo.vf_clip must be > 0"),
        ("ppo.vff_coef=1", "unknown key"),
        ("critic=twin", "critic must be one of shared, separate"),
        ("kl.mode=penalty", "kl.mode must be one of reward, loss"),
        ("ppo.minibatches=3", "do not split into ppo.minibatches=3"),
        ("algo.dynamic_sampling=true", "algo.dynamic_sampling is rl grpo's"),
        ("ppo.lam=1.5", "0 <= ppo.lam <= 1"),
        ("ppo.critic_lr_scale=0", "ppo.critic_lr_scale > 0"),
    ],
)
def test_config_errors_exit_2_with_one_line(tmp_path, dirs, capsys, override, message):
    assert _run(dirs, tmp_path / "out", *override.split()) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "out" / "model").exists()


def test_help_and_shipped_configs(capsys):
    from mm.config import load_config
    from rl.trainers.grpo import GRPOConfig
    from rl.trainers.ppo_config import PPOConfig

    with pytest.raises(SystemExit) as e:
        main(["ppo", "--help"])
    assert e.value.code == 0 and "--config" in capsys.readouterr().out
    for name in ("ppo.yaml", "ppo_tiny.yaml"):
        cfg = load_config(PPOConfig, CONFIG.parent / name)
        assert cfg.train.steps >= 1 and cfg.critic == "shared"
    big = load_config(PPOConfig, CONFIG.parent / "ppo.yaml")
    grpo = load_config(GRPOConfig, CONFIG.parent / "grpo.yaml")
    # the same sampling budget as GRPO: responses per step, token cap, steps, temperature
    responses = [c.data.prompts_per_step * c.rollout.group_size for c in (big, grpo)]
    assert responses[0] == responses[1]
    assert (big.rollout.max_new_tokens, big.train.steps, big.rollout.temperature) == (
        grpo.rollout.max_new_tokens,
        grpo.train.steps,
        grpo.rollout.temperature,
    )
