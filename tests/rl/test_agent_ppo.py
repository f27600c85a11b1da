"""Multi-turn PPO with a critic in ``rl agent``: the values equal a manual forward, GAE runs over the policy
tokens only (equal to GAE over each trajectory's compacted policy tokens), no gradient reaches an
observation from either loss term, the first update is on-policy, and the PPO stage resumes exactly and
can be added to a finished run."""

from __future__ import annotations

import json

import pytest
import torch

from mm.config import ConfigError, load_config
from rl.agent.backend import NoteVLMBackend
from rl.agent.config import AgentPPOConfig, AgentRunConfig
from rl.agent.loop import LoopConfig, rollout, trajectory_batch
from rl.agent.ppo import ppo_step, prepare_rollout, update_loss, values_of
from rl.trainers.value_head import value_head
from tests.rl.agent_helpers import tiny_notevlm
from tests.rl.test_agent_logps import _forced_rollout
from tests.rl.test_agent_run import SMALL, TINY

PPO = ["ppo.steps=2", "ppo.tasks_per_step=2", "ppo.samples_per_task=2", "ppo.checkpoint_every=1"]


def _head(adapter, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return value_head(adapter.model.config.text_config.hidden_size, std=0.5)


@pytest.fixture(scope="module")
def forced():
    adapter = tiny_notevlm(seed=3)
    backend, trajs = _forced_rollout(adapter, NoteVLMBackend)
    return adapter, backend, trajs


def test_values_equal_the_head_on_a_manual_forward(forced):
    adapter, backend, trajs = forced
    head = _head(adapter)
    batch, _ = trajectory_batch(backend, trajs)
    with torch.no_grad():
        logps, mask, values = values_of(backend, head, batch)
        want_logps, _ = adapter.token_logps(batch)
        inputs = {k: v for k, v in batch.items() if k != "response_mask"}
        inputs["position_ids"] = adapter.position_ids(batch)
        hidden = adapter.model(**inputs, use_cache=False, output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(logps, want_logps, atol=1e-6, rtol=0)
    B, T = mask.shape
    with torch.no_grad():
        for b in range(B):
            for t in range(T):
                want = float(head(hidden[b, t - 1])) if mask[b, t] else 0.0  # the state token t is chosen in
                assert float(values[b, t]) == pytest.approx(want, abs=1e-5)


def _compact_gae(rewards, values, gamma, lam):
    """Plain GAE (float64) over one trajectory's policy tokens alone."""
    adv, last = [0.0] * len(values), 0.0
    for t in reversed(range(len(values))):
        nxt = values[t + 1] if t + 1 < len(values) else 0.0
        last = rewards[t] + gamma * nxt - values[t] + gamma * lam * last
        adv[t] = last
    return adv


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.8)])
def test_gae_runs_over_policy_tokens_only(forced, gamma, lam):
    adapter, backend, trajs = forced
    assert all(
        sum(k == "observation" for k, _, _ in t.spans) >= 1 for t in trajs[:2]
    )  # tool spans between turns
    head = _head(adapter, seed=1)
    rewards = torch.tensor([1.0, -0.5, 0.25])
    cfg = AgentPPOConfig(gamma=gamma, lam=lam, whiten_advantages=False, minibatches=1)
    roll = prepare_rollout(backend, head, trajs, rewards, cfg)
    for b in range(len(trajs)):
        keep = roll.mask[b].bool()
        values = roll.old_values[b][keep].double().tolist()
        r = [0.0] * len(values)
        r[-1] = float(rewards[b])  # the reward sits on the last policy token
        want = _compact_gae(r, values, gamma, lam)
        want = torch.tensor(want, dtype=torch.float64)
        close = {"atol": 1e-5, "rtol": 1e-5}  # float32 accumulation over ~100 tokens
        torch.testing.assert_close(roll.advantages[b][keep].double(), want, **close)
        torch.testing.assert_close(
            roll.returns[b][keep].double(), want + torch.tensor(values).double(), **close
        )
        assert bool((roll.advantages[b][~keep] == 0).all()) and bool((roll.returns[b][~keep] == 0).all())
    whitened = prepare_rollout(backend, head, trajs, rewards, AgentPPOConfig(minibatches=1)).advantages
    on = roll.mask.bool()
    assert float(whitened[on].mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(whitened[on].std()) == pytest.approx(1.0, abs=1e-4)


def test_no_gradient_reaches_an_observation_from_either_loss(forced):
    adapter, backend, trajs = forced
    head = _head(adapter, seed=2)
    roll = prepare_rollout(
        backend, head, trajs, torch.tensor([1.0, 0.0, -1.0]), AgentPPOConfig(minibatches=1)
    )
    captured = {}

    def keep(module, args, out):
        out.retain_grad()
        captured["h"] = out  # (B, T, H): the final layer, read by the LM head and the value head only

    handle = adapter.model.model.language_model.norm.register_forward_hook(keep)
    try:
        loss, _ = update_loss(backend, head, roll, torch.arange(len(trajs)), AgentPPOConfig(vf_coef=1.0))
    finally:
        handle.remove()
    loss.backward()
    grad = captured["h"].grad.abs().sum(-1)  # (B, T)
    batch, _ = trajectory_batch(backend, trajs)
    nxt = batch["response_mask"][:, 1:]  # (B, T - 1): whether position p's next token is a policy token
    real = batch["attention_mask"][:, 1:] == 1
    observation = (nxt == 0) & real
    assert int(observation.sum()) > 100
    assert bool((grad[:, :-1][observation] == 0).all())  # exactly zero, not small
    assert bool((grad[:, :-1][nxt == 1] > 0).all())
    assert head.weight.grad is not None and float(head.weight.grad.abs().sum()) > 0
    adapter.model.zero_grad(set_to_none=True)


def test_first_update_is_on_policy_and_a_step_moves_policy_and_critic():
    adapter = tiny_notevlm(seed=4)
    backend = NoteVLMBackend(adapter)
    from rl.agent.backend import Sampling
    from tests.rl.test_agent_train import _tasks

    torch.manual_seed(1)
    loop = LoopConfig(max_turns=2, max_new_tokens=8, max_tokens=12, sampling=Sampling(do_sample=True))
    trajs = rollout(backend, [t for t in _tasks() for _ in range(2)], loop)
    head = _head(adapter, seed=3)
    cfg = AgentPPOConfig(epochs=1, minibatches=1)
    roll = prepare_rollout(backend, head, trajs, torch.tensor([1.0, 0.0, 0.0, 1.0]), cfg)
    _, metrics = update_loss(backend, head, roll, torch.arange(4), cfg)
    assert abs(float(metrics["approx_kl"])) < 1e-6
    assert float(metrics["clip_frac_low"]) == float(metrics["clip_frac_high"]) == 0.0
    before = [p.detach().clone() for p in [*adapter.model.parameters(), *head.parameters()]]
    optimizer = torch.optim.SGD([*adapter.model.parameters(), *head.parameters()], lr=1e-2)
    out = ppo_step(backend, head, optimizer, trajs, lambda t: float(t.task.task_id == "c"),
                   AgentPPOConfig(epochs=2, minibatches=2), seed=0)  # fmt: skip
    assert {"reward_mean", "value_loss", "explained_variance", "approx_kl", "grad_norm"} <= set(out)
    after = [*adapter.model.parameters(), *head.parameters()]
    assert not torch.equal(before[-2], after[-2])  # the value head learned
    assert any(not torch.equal(a, b) for a, b in zip(before[:-2], after[:-2]))


def test_config_checks():
    with pytest.raises(ValueError, match="must divide the 6 trajectories"):
        AgentPPOConfig(tasks_per_step=3, samples_per_task=2, minibatches=4)
    with pytest.raises(ValueError, match="ppo.agg"):
        AgentPPOConfig(agg="mean")
    with pytest.raises((ConfigError, ValueError), match="steps"):
        load_config(AgentRunConfig, TINY, [*SMALL, "ppo.steps=-1"])
    assert AgentRunConfig().ppo.steps == 0 and AgentRunConfig().ppo.lam == 1.0


def test_ppo_stage_stopped_and_resumed_equals_uninterrupted(tmp_path):
    from rl.agent.run import run_agent

    cfg = load_config(AgentRunConfig, TINY, [*SMALL, *PPO])
    whole = run_agent(cfg, tmp_path / "whole", log=lambda s: None)
    cut = tmp_path / "cut"
    assert run_agent(cfg, cut, log=lambda s: None, ppo_stop_after=1) is None
    assert not (cut / "ppo/result.json").exists() and (cut / "ppo/checkpoint.pt").exists()
    resumed = run_agent(cfg, cut, log=lambda s: None)
    a = (tmp_path / "whole/ppo/metrics.jsonl").read_text().splitlines()
    assert len(a) == 2 and a == (cut / "ppo/metrics.jsonl").read_text().splitlines()
    assert resumed["metrics"] == whole["metrics"] and set(whole["metrics"]) >= {"tool_ppo", "tool_grpo"}
    assert "gains_tool_ppo_over_tool_grpo" in whole
    for name in ("tool_ppo", "tool_grpo"):
        assert (cut / f"eval/{name}.jsonl").read_text() == (tmp_path / f"whole/eval/{name}.jsonl").read_text()
    assert (cut / "ppo/value_head.pt").exists() and (cut / "ppo.png").stat().st_size > 0


def test_ppo_added_to_a_finished_run(tmp_path, capsys):
    from rl.cli import main

    out = tmp_path / "run"
    assert main(["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL]) == 0
    rows = {m: (out / f"eval/{m}.jsonl").read_bytes() for m in ("notool_sft", "tool_sft", "tool_grpo")}
    assert "tool_ppo" not in json.loads((out / "report.json").read_text())["metrics"]
    capsys.readouterr()
    assert main(["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL, *PPO]) == 0
    log = capsys.readouterr().out
    assert "grpo: done before, skipped" in log and "ppo: done in" in log and "eval: done in" in log
    assert "export: done in" in log and (out / "export/tool_ppo/config.json").exists()  # exported too
    assert {m: (out / f"eval/{m}.jsonl").read_bytes() for m in rows} == rows  # not evaluated again
    report = json.loads((out / "report.json").read_text())
    assert list(report["metrics"]) == ["notool_sft", "tool_sft", "tool_grpo", "tool_ppo"]
    assert "| tool_ppo - tool_grpo |" in (out / "report.md").read_text()
    # once PPO has trained, its settings are kept like the others
    assert main(["agent", "--config", str(TINY), "--out", str(out), "--set", *SMALL, *PPO, "ppo.lr=0.5"]) == 2
    assert "other ppo settings" in capsys.readouterr().err
