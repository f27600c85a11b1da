"""The agent loop driven by a scripted policy (deterministic): trajectory layout, masks, images, invalid
calls, finished trajectories leaving the batch, and every truncation."""

from __future__ import annotations

import pytest
import torch

from rl.agent.backend import OBS_CLOSE, OBS_OPEN, Sampling, cut_turn
from rl.agent.loop import LoopConfig, rollout, summary, trajectory_batch
from rl.agent.parse import ParseError, ToolCall
from rl.agent.task import AgentTask
from tests.helpers.model import K
from tests.rl.agent_helpers import ScriptedBackend, change_pair, note_images, tiny_notevlm

ZOOM = '<tool>{"name": "zoom", "image": 2, "box": [0.1, 0.1, 0.2, 0.3]}</tool>'
COMPARE = '<tool>{"name": "compare", "images": [1, 2]}</tool>'
SCRIPT = {
    "what changed": ["let me compare " + COMPARE, "and look " + ZOOM, "a red square was added"],
    "what colour": ["red"],
    "how many": [ZOOM, "two"],
}


@pytest.fixture(scope="module")
def adapter():
    return tiny_notevlm(seed=1)


def _tasks() -> list[AgentTask]:
    a, b = change_pair()
    return [
        AgentTask(task_id="c", kind="change", sources=(a, b), question="what changed", answer="red square"),
        AgentTask(task_id="d", kind="detail", sources=note_images(1), question="what colour", answer="red"),
        AgentTask(
            task_id="n", kind="detail", sources=note_images(2, seed=1), question="how many", answer="2"
        ),
    ]


def _run(adapter, script=SCRIPT, tasks=None, **cfg):
    backend = ScriptedBackend(adapter, script)
    cfg.setdefault("instructions", False)
    return backend, rollout(backend, tasks or _tasks(), LoopConfig(**cfg))


def test_transcript_of_a_scripted_rollout(adapter):
    _, trajs = _run(adapter)
    assert trajs[0].transcript() == "\n".join(
        [
            "[task c] what changed",
            "[policy 1] let me compare " + COMPARE,
            "[observation 1] 2 regions changed: [0.75, 0.50, 0.95, 0.90] [0.10, 0.10, 0.20, 0.30]",
            "[policy 2] and look " + ZOOM,
            "[observation 2] zoom of image 2 at [0.10, 0.10, 0.20, 0.30] (8x8 px of the source): (+image)",
            "[policy 3] a red square was added",
            "[end] answer: a red square was added (expected: red square)",
        ]
    )
    assert [t.answer for t in trajs] == ["a red square was added", "red", "two"]
    assert [len(t.turns) for t in trajs] == [3, 1, 2] and all(t.truncation is None for t in trajs)
    assert [c.call for c in trajs[2].calls] == [ToolCall("zoom", {"image": 2, "box": [0.1, 0.1, 0.2, 0.3]})]


def test_rollouts_are_deterministic(adapter):
    _, one = _run(adapter)
    _, two = _run(adapter)
    assert [t.ids for t in one] == [t.ids for t in two]
    assert [t.response_mask for t in one] == [t.response_mask for t in two]


def test_mask_is_one_exactly_on_the_policy_tokens(adapter):
    backend, trajs = _run(adapter)
    eos = backend.eos_token_ids[0]
    for traj in trajs:
        assert len(traj.ids) == len(traj.response_mask) == len(traj.logps)
        kinds = [k for k, _, _ in traj.spans]
        assert kinds[0] == "prompt" and kinds[1::2] == ["policy"] * len(traj.turns)
        assert kinds[2::2] == ["observation"] * len(traj.calls)
        assert traj.spans[-1][2] == len(traj.ids)
        lines = SCRIPT[traj.task.question]
        for (_, start, end), turn in zip(traj.spans[1::2], range(len(traj.turns))):
            ids = backend.text_ids(lines[turn])
            expected = ids if lines[turn].endswith("</tool>") else [*ids, eos]
            assert traj.ids[start:end] == expected and set(traj.response_mask[start:end]) == {1}
        for _, start, end in traj.spans[2::2]:
            assert set(traj.response_mask[start:end]) == {0}
            text = backend.tokenizer.decode(traj.ids[start:end])
            assert text.startswith(OBS_OPEN) and text.endswith(OBS_CLOSE)
        prompt = backend.adapter.processor.prompt_ids(len(traj.task.sources), traj.task.question)
        assert traj.ids[: traj.prompt_length] == prompt and not any(traj.response_mask[: traj.prompt_length])
        assert traj.policy_tokens == sum(e - s for k, s, e in traj.spans if k == "policy")


def test_zoom_images_are_spliced_in_order(adapter):
    backend, trajs = _run(adapter)
    proc = backend.adapter.processor
    for traj in trajs:
        zooms = sum(c.image_added for c in traj.calls)
        assert len(traj.images) == len(traj.task.sources) + zooms
        assert traj.ids.count(proc.image_token_id) == len(traj.images) * K
    assert trajs[0].calls[1].image_added
    a, b = change_pair()
    expected = proc.load_image(b[4:12, 8:16])
    torch.testing.assert_close(trajs[0].images[2], expected, atol=0, rtol=0)


def test_finished_trajectories_leave_the_batch(adapter):
    backend, _ = _run(adapter)
    assert backend.calls == [3, 2, 1]
    backend, _ = _run(adapter, batch_size=2)
    assert backend.calls == [2, 1, 2, 1]


def test_invalid_calls_get_an_error_observation_and_the_loop_goes_on(adapter):
    script = {"what colour": ['<tool>{"name": "zoom", "image": 5, "box": [0, 0, 1, 1]}</tool>',
                              '<tool>{"name": "zoom", "image": 1', "blue"]}  # fmt: skip
    _, (traj,) = _run(adapter, script, tasks=_tasks()[1:2])
    assert traj.answer == "blue" and traj.n_invalid_calls == 2 and traj.n_valid_calls == 0
    first, second = traj.calls
    assert first.call == ParseError("image_out_of_range", "image=5 but the note has images 1..1")
    assert first.observation == "error: image=5 but the note has images 1..1"
    assert second.call.reason == "unclosed"  # ended with eos inside an unclosed call
    assert summary([traj])["valid_call_rate"] == 0.0


def test_max_turns_truncates_and_does_not_run_the_last_call(adapter):
    _, (traj,) = _run(adapter, {"how many": [ZOOM]}, tasks=_tasks()[2:], max_turns=3)
    assert traj.truncation == "max_turns" and traj.answer is None
    assert len(traj.turns) == 3 and len(traj.calls) == 3
    assert [k for k, _, _ in traj.spans] == [
        "prompt",
        "policy",
        "observation",
        "policy",
        "observation",
        "policy",
    ]
    assert traj.calls[-1].observation == "(not run: no turns left)" and traj.calls[-1].valid
    assert traj.response_mask[-1] == 1


def test_max_tokens_caps_the_policy_tokens_of_a_trajectory(adapter):
    backend, (traj,) = _run(adapter, {"how many": [ZOOM]}, tasks=_tasks()[2:], max_tokens=100, max_turns=9)
    call = len(backend.text_ids(ZOOM))
    assert call < 100 < 2 * call
    assert traj.truncation == "max_tokens" and traj.policy_tokens == 100
    assert len(traj.turns) == 2 and traj.calls[0].valid and len(traj.calls) == 1


def test_turn_tokens_caps_one_turn(adapter):
    long = "a red cup on the left of a blue plate " * 4
    _, (traj,) = _run(adapter, {"what colour": [long]}, tasks=_tasks()[1:2], max_new_tokens=7)
    assert traj.truncation == "turn_tokens" and traj.policy_tokens == 7 and traj.answer is None


def test_context_limit_stops_before_the_model_overflows(adapter):
    tasks = _tasks()[2:]
    _, (full,) = _run(adapter, tasks=tasks)
    limit = full.spans[2][2] + 1  # the first observation fits, one token of the second turn
    _, (traj,) = _run(adapter, tasks=tasks, max_length=limit)
    assert traj.truncation == "context" and len(traj.ids) == limit
    assert traj.ids == full.ids[:limit]


def test_images_beyond_the_models_limit_become_text(adapter):
    small = tiny_notevlm(seed=1, max_images=3)
    _, (traj,) = _run(small, {"how many": [ZOOM, ZOOM, "two"]}, tasks=_tasks()[2:])
    assert [c.image_added for c in traj.calls] == [True, False]
    assert traj.calls[1].observation.endswith("(image not shown: the model takes at most 3 images)")
    assert len(traj.images) == 3 and traj.answer == "two"


def test_an_observation_may_carry_several_images(adapter):
    both = '<tool>{"name": "compare", "images": [1, 2], "zoom": true}</tool>'
    backend, (traj,) = _run(adapter, {"what changed": [both, "added"]}, tasks=_tasks()[:1])
    proc = backend.adapter.processor
    a, b = change_pair()
    assert traj.calls[0].image_added and len(traj.images) == 4
    assert traj.ids.count(proc.image_token_id) == 4 * K
    torch.testing.assert_close(traj.images[2], proc.load_image(a[0:40, 22:62]), atol=0, rtol=0)
    torch.testing.assert_close(traj.images[3], proc.load_image(b[0:40, 22:62]), atol=0, rtol=0)
    small = tiny_notevlm(seed=1, max_images=3)  # room for one more image, not two: neither is shown
    _, (cut,) = _run(small, {"what changed": [both, "added"]}, tasks=_tasks()[:1])
    assert not cut.calls[0].image_added and len(cut.images) == 2
    assert cut.calls[0].observation.endswith("(images not shown: the model takes at most 3 images)")


def test_trajectory_batch_aligns_masks_and_logps(adapter):
    backend, trajs = _run(adapter)
    for t in trajs:  # stand-in sampling log-probs: -position on policy tokens
        t.logps = [-float(i) if m else 0.0 for i, m in enumerate(t.response_mask)]
    batch, old = trajectory_batch(backend, trajs)
    T = max(len(t.ids) for t in trajs)
    assert batch["input_ids"].shape == batch["response_mask"].shape == old.shape == (3, T)
    assert batch["pixel_values"].shape[:2] == batch["image_mask"].shape == (3, 3)
    for b, t in enumerate(trajs):
        n = len(t.ids)
        assert batch["input_ids"][b, T - n :].tolist() == t.ids
        assert batch["response_mask"][b].tolist() == [0] * (T - n) + t.response_mask
        assert batch["attention_mask"][b].sum() == n
        assert old[b, T - n :].tolist() == t.logps
        assert batch["image_mask"][b].sum() == len(t.images)


def test_cut_turn_stops_at_the_first_eos_or_tool_close(adapter):
    backend = ScriptedBackend(adapter, SCRIPT)
    eos = backend.eos_token_ids[0]
    call = backend.text_ids(ZOOM)
    assert cut_turn([*call, *backend.text_ids(" more"), eos], [eos], backend.decode) == (call, "tool")
    answer = backend.text_ids("red")
    assert cut_turn([*answer, eos, *call], [eos], backend.decode) == ([*answer, eos], "eos")
    assert cut_turn(answer, [eos], backend.decode) == (answer, "length")


def test_sampling_rejects_bad_settings():
    with pytest.raises(ValueError, match="temperature > 0"):
        Sampling(do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="top_p <= 1"):
        Sampling(top_p=1.5)


@pytest.mark.parametrize("field", ["max_turns", "max_new_tokens", "max_tokens", "batch_size"])
def test_loop_config_rejects_non_positive_limits(field):
    with pytest.raises(ValueError, match=f"LoopConfig.{field} must be >= 1"):
        LoopConfig(**{field: 0})


def test_mask_turns_takes_policy_turns_out_of_the_loss_only():
    from rl.agent.backend import Segment
    from rl.agent.trajectory import Trajectory

    traj = Trajectory.start(_tasks()[1], Segment([5, 6]))
    traj.add_policy([7, 8], [-0.1, -0.2], "a")
    traj.add_observation(Segment([9]))
    assert traj.train_mask is traj.response_mask and traj.loss_mask is None
    traj.mask_turns({0})
    assert traj.loss_mask == [0, 0, 0, 0, 0] and traj.response_mask == [0, 0, 1, 1, 0]
    traj.add_policy([10, 11, 12], [0.0] * 3, "b")  # later turns are trained
    assert traj.train_mask == [0, 0, 0, 0, 0, 1, 1, 1] and traj.response_mask == [0, 0, 1, 1, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="out of range: 2 policy turns"):
        traj.mask_turns({2})
