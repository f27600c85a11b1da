"""Training the tool-using policy: demonstrations through the loop, the SFT loss (parity with NoteVLM's own
SFT loss, cold start that reproduces the demonstrations), and multi-turn GRPO (on-policy first step,
zero loss for equal rewards, one step raises the advantage-weighted log-likelihood)."""

from __future__ import annotations

import pytest
import torch

from rl.advantages import group_advantages
from rl.agent.backend import NoteVLMBackend, Sampling
from rl.agent.config import GRPOStageConfig
from rl.agent.demos import demo_turns, scripted_policy, tool_text
from rl.agent.loop import LoopConfig, rollout, trajectory_batch
from rl.agent.task import AgentTask
from rl.agent.train import (
    AgentGRPOConfig,
    answer_reward,
    call_token_weights,
    grpo_loss,
    grpo_step,
    judged_scores,
    normalise_answer,
    reply_scores,
    sft_loss,
    turn_advantages,
    turn_token_advantages,
)
from rl.agent.trajectory import Trajectory, UserTurn
from tests.rl.agent_helpers import change_pair, note_images, tiny_notevlm

LOOP = LoopConfig(max_turns=4, max_new_tokens=64, instructions=False)


def _tasks() -> list[AgentTask]:
    a, b = change_pair()
    return [
        AgentTask(task_id="c", kind="change", sources=(a, b), question="what changed", answer="a red square"),
        AgentTask(
            task_id="d",
            kind="detail",
            sources=note_images(1, seed=5),
            question="what colour is the cup",
            answer="blue",
            meta={"box": [0.5, 0.5, 1, 1]},
        ),
    ]


def _demos(backend, tasks):
    turns = {t.task_id: demo_turns(t) for t in tasks}
    return rollout(backend, tasks, LOOP, policy=scripted_policy(backend, turns))


def test_demo_turns_call_the_tool_each_kind_needs():
    change, detail = _tasks()
    assert demo_turns(change) == ['<tool>{"name": "compare", "images": [1, 2]}</tool>', "a red square"]
    assert demo_turns(detail) == [
        '<tool>{"name": "zoom", "image": 1, "box": [0.5, 0.5, 1.0, 1.0]}</tool>',
        "blue",
    ]
    assert (
        tool_text("zoom", image=2, box=[0, 0, 1, 1])
        == '<tool>{"name": "zoom", "image": 2, "box": [0, 0, 1, 1]}</tool>'
    )


def test_demonstrations_run_the_real_tools():
    backend = NoteVLMBackend(tiny_notevlm())
    change, detail = _demos(backend, _tasks())
    assert (
        change.calls[0].observation == "2 regions changed: [0.75, 0.50, 0.95, 0.90] [0.10, 0.10, 0.20, 0.30]"
    )
    assert detail.calls[0].image_added and len(detail.images) == 2
    assert change.answer == "a red square" and detail.answer == "blue"


def test_scripted_policy_needs_every_task():
    backend = NoteVLMBackend(tiny_notevlm())
    with pytest.raises(KeyError, match="no demonstration turns for task 'c'"):
        rollout(backend, _tasks(), LOOP, policy=scripted_policy(backend, {"d": ["blue"]}))


def test_sft_loss_of_a_one_turn_demo_equals_notevlm_sft_loss():
    adapter = tiny_notevlm(seed=4)
    backend = NoteVLMBackend(adapter)
    task = AgentTask(
        task_id="x", kind="detail", sources=note_images(2), question="what colour", answer="red cup"
    )
    (demo,) = rollout(backend, [task], LOOP, policy=scripted_policy(backend, {"x": ["red cup"]}))
    proc = adapter.processor
    enc = proc.collate([proc.encode(list(task.sources), "what colour", "red cup")])
    with torch.no_grad():
        ours = sft_loss(backend, [demo])
        ref = adapter.model(**enc).loss
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_call_weights_cover_exactly_the_turns_that_call_a_tool():
    backend = NoteVLMBackend(tiny_notevlm(seed=4))
    change, detail = demos = _demos(backend, _tasks())
    w = call_token_weights(demos, 3.0)  # (2, T), left padded
    T = w.shape[1]
    for b, traj in enumerate(demos):
        policy = [(s, e) for kind, s, e in traj.spans if kind == "policy"]
        assert len(policy) == 2 and [c.turn for c in traj.calls] == [1]  # a call, then the answer
        pad = T - len(traj.ids)
        want = torch.ones(T)
        want[pad + policy[0][0] : pad + policy[0][1]] = 3.0
        assert torch.equal(w[b], want)


def test_weighted_sft_loss_is_the_weighted_token_mean():
    """``call_weight`` 1 is the plain token mean; 3 is sum(w * nll) / sum(w) over the trained tokens, with
    w = 3 on the call turns' tokens (float64 by hand from one forward)."""
    adapter = tiny_notevlm(seed=4)
    backend = NoteVLMBackend(adapter)
    demos = _demos(backend, _tasks())
    batch = backend.model_inputs([t.segment for t in demos], [t.train_mask for t in demos])
    with torch.no_grad():
        logps, mask = adapter.token_logps(batch)
        plain = sft_loss(backend, demos)
        weighted = sft_loss(backend, demos, call_weight=3.0)
    nll, m = -logps.double(), mask.double()
    torch.testing.assert_close(plain.double(), (nll * m).sum() / m.sum(), atol=1e-6, rtol=0)
    w = call_token_weights(demos, 3.0).double() * m
    torch.testing.assert_close(weighted.double(), (nll * w).sum() / w.sum(), atol=1e-6, rtol=0)
    on_calls = (w == 3.0).sum().item()
    assert 0 < on_calls < m.sum().item()  # both kinds of token are there
    assert weighted.item() != pytest.approx(plain.item())


@pytest.mark.slow
def test_sft_cold_start_reproduces_the_demonstrations():
    """A tiny NoteVLM learns to call compare / zoom with valid JSON, read the result and answer."""
    adapter = tiny_notevlm(seed=0)
    backend = NoteVLMBackend(adapter)
    tasks = _tasks()
    demos = _demos(backend, tasks)
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(adapter.model.parameters(), lr=2e-2)
    adapter.model.train()
    losses = []
    for _ in range(80):
        optimizer.zero_grad()
        loss = sft_loss(backend, demos)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    adapter.model.eval()
    assert losses[-1] < 0.1 < 5 < losses[0]
    trajs = rollout(backend, tasks, LOOP)
    assert [t.ids for t in trajs] == [d.ids for d in demos]
    assert all(t.n_valid_calls == 1 and t.n_invalid_calls == 0 for t in trajs)
    assert [answer_reward(t) for t in trajs] == [1.0, 1.0]


def _sampled(adapter, group_size=2):
    backend = NoteVLMBackend(adapter)
    torch.manual_seed(1)
    loop = LoopConfig(max_turns=2, max_new_tokens=8, max_tokens=12, sampling=Sampling(do_sample=True))
    group = [t for t in _tasks() for _ in range(group_size)]
    return backend, rollout(backend, group, loop)


def test_grpo_first_step_is_on_policy_and_equal_rewards_give_no_gradient():
    adapter = tiny_notevlm(seed=6)
    backend, trajs = _sampled(adapter)
    cfg = AgentGRPOConfig(group_size=2)
    loss, metrics = grpo_loss(backend, trajs, torch.tensor([1.0, 0.0, 0.0, 1.0]), cfg)
    assert abs(float(metrics["approx_kl"])) < 1e-6
    assert float(metrics["clip_frac_low"]) == float(metrics["clip_frac_high"]) == 0.0
    adapter.model.zero_grad(set_to_none=True)
    flat, _ = grpo_loss(backend, trajs, torch.tensor([0.5, 0.5, 1.0, 1.0]), cfg)
    flat.backward()
    assert float(flat.detach()) == 0.0
    assert all(p.grad is None or bool((p.grad == 0).all()) for p in adapter.model.parameters())


def test_one_grpo_step_raises_the_advantage_weighted_log_likelihood():
    adapter = tiny_notevlm(seed=7)
    backend, trajs = _sampled(adapter)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    advantages = group_advantages(rewards, group_size=2)

    def objective() -> float:
        batch, _ = trajectory_batch(backend, trajs)
        with torch.no_grad():
            logps, mask = adapter.token_logps(batch)
        per_traj = (logps * mask).sum(1) / mask.sum(1)  # (B,)
        return float((advantages * per_traj).sum())

    before = objective()
    optimizer = torch.optim.SGD(adapter.model.parameters(), lr=1e-2)
    loss, _ = grpo_loss(backend, trajs, rewards, AgentGRPOConfig(group_size=2, agg="seq-mean-token-mean"))
    loss.backward()
    optimizer.step()
    assert objective() > before


def test_grpo_step_rolls_out_groups_and_reports():
    adapter = tiny_notevlm(seed=8)
    backend = NoteVLMBackend(adapter)
    torch.manual_seed(2)
    loop = LoopConfig(max_turns=2, max_new_tokens=6, max_tokens=10, sampling=Sampling(do_sample=True))
    optimizer = torch.optim.SGD(adapter.model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in adapter.model.parameters()]
    trajs, metrics = grpo_step(
        backend,
        _tasks(),
        lambda t: float(len(t.turns) + t.policy_tokens % 3),
        optimizer,
        AgentGRPOConfig(group_size=3),
        loop,
    )
    assert [t.task.task_id for t in trajs] == ["c"] * 3 + ["d"] * 3
    assert metrics["trajectories"] == 6.0 and set(metrics) >= {
        "loss",
        "reward_mean",
        "approx_kl",
        "valid_call_rate",
    }
    changed = any(not torch.equal(a, p) for a, p in zip(before, adapter.model.parameters()))
    assert changed == (metrics["advantage_abs_mean"] > 0)


def test_rewards_and_config_checks():
    assert normalise_answer(" Red, cup! ") == "red cup"
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        AgentGRPOConfig(group_size=1)
    with pytest.raises(ValueError, match="agg must be one of"):
        AgentGRPOConfig(agg="mean")
    backend, trajs = _sampled(tiny_notevlm(seed=9))
    with pytest.raises(ValueError, match="multiple of group_size=2"):
        grpo_loss(backend, trajs[:3], torch.zeros(3), AgentGRPOConfig(group_size=2))


def test_turn_advantages_cover_exactly_each_turns_tokens():
    backend = NoteVLMBackend(tiny_notevlm())
    change, detail = _demos(backend, _tasks())
    adv = turn_token_advantages([change, detail], [[0.5, -1.0], [2.0, 3.0]])
    batch, _ = trajectory_batch(backend, [change, detail])
    assert adv.shape == batch["response_mask"].shape
    assert torch.equal(adv != 0, batch["response_mask"] == 1)
    T = adv.shape[1]
    for b, (traj, values) in enumerate(zip([change, detail], [[0.5, -1.0], [2.0, 3.0]])):
        pad = T - len(traj.ids)
        spans = [(s, e) for k, s, e in traj.spans if k == "policy"]
        for (s, e), v in zip(spans, values):
            assert adv[b, pad + s : pad + e].tolist() == [v] * (e - s)
    loss, _ = grpo_loss(
        backend, [change, detail], torch.zeros(2), AgentGRPOConfig(group_size=2), advantages=adv
    )
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="has 2 turns but 1 turn advantages"):
        turn_token_advantages([change, detail], [[1.0], [1.0, 2.0]])


def _judged(turns: list[str], scores: dict[int, float], task_id: str = "g") -> Trajectory:
    """A trajectory carrying only turns and the simulated user's scores (what turn credit reads)."""
    task = AgentTask(task_id=task_id, kind="dialogue", sources=note_images(1), question="q", answer="a")
    users = [UserTurn(turn, "u", score, False) for turn, score in sorted(scores.items())]
    return Trajectory(task, [], [], [], [], turns=turns, user_turns=users)


def test_reply_scores_give_tool_calls_the_score_of_the_reply_they_led_to():
    traj = _judged(
        ["<tool>a</tool>", "two", "<tool>b</tool>", "<tool>c</tool>", "three", "<tool>d"], {2: 0.0, 5: 1.0}
    )
    assert reply_scores(traj) == [0.0, 0.0, 1.0, 1.0, 1.0, None]  # the last turn closed no reply
    assert reply_scores(_judged(["x"], {})) == [None]


def test_turn_advantages_golden():
    # group 1: replies scored 0, 1 | 1 -> mean 2/3, unbiased std sqrt(1/3); group 2: all equal -> 0
    group1 = [_judged(["<tool>z</tool>", "a", "b"], {2: 0.0, 3: 1.0}), _judged(["c"], {1: 1.0})]
    group2 = [_judged(["d"], {1: 0.5}), _judged(["e", "f"], {1: 0.5})]
    adv = turn_advantages([*group1, *group2], group_size=2)
    s = (1 / 3) ** 0.5 + 1e-4
    assert adv[0] == pytest.approx([-2 / 3 / s, -2 / 3 / s, 1 / 3 / s], abs=1e-12)
    assert adv[1] == pytest.approx([1 / 3 / s], abs=1e-12)
    assert adv[2:] == [[0.0], [0.0, 0.0]]
    none = turn_advantages(group1, group_size=2, scale="none")
    assert none == [pytest.approx([-2 / 3, -2 / 3, 1 / 3]), pytest.approx([1 / 3])]
    with pytest.raises(ValueError, match="groups of 2"):
        turn_advantages(group1[:1], group_size=2)


def test_batch_scaled_turn_advantages_of_a_share_are_the_whole_batchs_rows():
    # data parallel: a rank holds two of the four groups; with every rank's judged scores it gets the
    # rows one process computes on the whole batch
    groups = [
        [_judged(["a", "b"], {1: 0.0, 2: 1.0}), _judged(["c"], {1: 1.0})],
        [_judged(["d"], {1: 0.25}), _judged(["e"], {1: 0.75})],
        [_judged(["f"], {1: 0.0}), _judged(["g", "h"], {2: 0.5})],
        [_judged(["i"], {1: 1.0}), _judged(["j"], {1: 0.0})],
    ]
    whole = [t for g in groups for t in g]
    want = turn_advantages(whole, group_size=2, scale="batch")
    scores = judged_scores(whole)
    assert scores == [0.0, 1.0, 1.0, 0.25, 0.75, 0.0, 0.5, 1.0, 0.0]
    for rows in (slice(0, 4), slice(4, 8)):
        share = turn_advantages(whole[rows], group_size=2, scale="batch", batch_scores=scores)
        assert share == want[rows]
    alone = turn_advantages(whole[4:], group_size=2, scale="batch")  # its own std: other values
    assert alone != want[4:]


def test_turn_credit_adds_turn_advantages_to_the_trajectory_advantage():
    adapter = tiny_notevlm(seed=6)
    backend, trajs = _sampled(adapter)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    plain = AgentGRPOConfig(group_size=2)
    credit = AgentGRPOConfig(group_size=2, turn_credit=0.5)
    with torch.no_grad():  # no simulated user: the same loss
        assert float(grpo_loss(backend, trajs, rewards, credit)[0]) == float(
            grpo_loss(backend, trajs, rewards, plain)[0]
        )
    for traj, score in zip(trajs, [1.0, 0.0, 0.5, 0.5]):
        traj.user_turns = [UserTurn(len(traj.turns), "u", score, True)]  # the user judged each last turn
    turns = turn_advantages(trajs, group_size=2)
    assert turns[2] == [0.0] * len(trajs[2].turns) and turns[0][-1] > 0 > turns[1][-1]
    want = group_advantages(rewards, group_size=2)[:, None] + 0.5 * turn_token_advantages(
        trajs, turns
    )  # (B, T)

    def grads(cfg, **kw) -> torch.Tensor:
        adapter.model.zero_grad(set_to_none=True)
        grpo_loss(backend, trajs, rewards, cfg, **kw)[0].backward()
        return torch.cat([p.grad.flatten() for p in adapter.model.parameters() if p.grad is not None])

    ours = grads(credit)
    torch.testing.assert_close(ours, grads(plain, advantages=want), atol=0, rtol=0)
    assert not torch.allclose(ours, grads(plain))
    with pytest.raises(ValueError, match="turn_credit"):
        AgentGRPOConfig(turn_credit=-1.0)
    with pytest.raises(ValueError, match="zoom_reward_weight must be >= 0"):
        GRPOStageConfig(zoom_reward_weight=-0.5)
