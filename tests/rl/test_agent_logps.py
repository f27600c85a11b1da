"""Real tiny models in the loop: a trajectory's sampling-time log-probs equal one forward pass over its
concatenated ids (NoteVLM, LLaVA, LLaVA-NeXT, Qwen2-VL, Idefics3, with zoom images spliced in
mid-sequence), and the loss
gradient is exactly zero on every logit that predicts an observation token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mm.errors import UserError
from mm.model.adapter import load_adapter
from rl.agent.backend import (
    FlatImageBackend,
    NoteVLMBackend,
    PatchedImageBackend,
    PatchRunBackend,
    Sampling,
    TiledImageBackend,
    backend_for,
)
from rl.agent.loop import LoopConfig, rollout, trajectory_batch
from rl.agent.task import AgentTask
from rl.losses import policy_loss
from tests.mm.adapter_helpers import build_family
from tests.rl.agent_helpers import change_pair, forced, note_images, tiny_notevlm

SCRIPT = {
    "what changed": [
        'first <tool>{"name": "compare", "images": [1, 2]}</tool>',
        '<tool>{"name": "zoom", "image": 2, "box": [0.1, 0.1, 0.2, 0.3]}</tool>',
        "a red square",
    ],
    "how many": ['<tool>{"name": "zoom", "image": 1, "box": [0.5, 0.5, 1, 1]}</tool>', "two cups"],
    "what colour": ["blue"],
}


def _tasks() -> list[AgentTask]:
    a, b = change_pair()
    return [
        AgentTask(task_id="c", kind="change", sources=(a, b), question="what changed", answer="a red square"),
        AgentTask(
            task_id="n", kind="detail", sources=note_images(1, seed=2), question="how many", answer="2"
        ),
        AgentTask(
            task_id="d", kind="detail", sources=note_images(2, seed=3), question="what colour", answer="red"
        ),
    ]


@pytest.fixture(scope="module")
def notevlm():
    return tiny_notevlm(seed=2)


def _forced_rollout(adapter, backend_cls):
    backend = forced(backend_cls, adapter, SCRIPT)
    trajs = rollout(backend, _tasks(), LoopConfig(max_turns=4, instructions=False))
    assert [t.answer for t in trajs] == ["a red square", "two cups", "blue"]
    assert [len(t.images) for t in trajs] == [3, 2, 2]  # one zoom each in the first two
    return backend, trajs


def _assert_one_forward_parity(adapter, backend, trajs):
    batch, old = trajectory_batch(backend, trajs)
    with torch.no_grad():
        logps, mask = adapter.token_logps(batch)
    assert torch.equal(mask, batch["response_mask"])
    assert bool((old[mask == 0] == 0).all()) and bool((old[mask == 1] < 0).all())
    torch.testing.assert_close(logps, old, atol=2e-5, rtol=0)


def test_notevlm_trajectory_logps_equal_one_forward(notevlm):
    backend, trajs = _forced_rollout(notevlm, NoteVLMBackend)
    _assert_one_forward_parity(notevlm, backend, trajs)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3"])
def test_hf_family_trajectory_logps_equal_one_forward(family, tmp_path):
    adapter = load_adapter(build_family(family, tmp_path / family))
    assert isinstance(backend_for(adapter), FlatImageBackend)
    backend, trajs = _forced_rollout(adapter, FlatImageBackend)
    batch, _ = trajectory_batch(backend, trajs)
    images = batch.get("image_grid_thw", batch["pixel_values"])
    assert images.shape[0] == 7  # 2 + 1 + 2 note images, 2 zooms, flat over the batch
    _assert_one_forward_parity(adapter, backend, trajs)


def test_internvl_patch_runs_trajectory_logps_equal_one_forward(tmp_path):
    """InternVL: every image is a run of patches (up to 4 tiles and a thumbnail here, by its aspect ratio),
    flat over the batch, told apart by its run of context tokens."""
    adapter = load_adapter(build_family("internvl", tmp_path / "internvl"))
    assert isinstance(backend_for(adapter), PatchRunBackend)
    backend, trajs = _forced_rollout(adapter, PatchRunBackend)
    per_image = [im["pixel_values"].shape[0] for t in trajs for im in t.images]
    assert len(per_image) == 7 and len(set(per_image)) > 1  # images of other shapes, other patch counts
    batch, _ = trajectory_batch(backend, trajs)
    assert batch["pixel_values"].shape[0] == sum(per_image)
    _assert_one_forward_parity(adapter, backend, trajs)
    seg = backend.image_segment(np.zeros((20, 48, 3), dtype=np.uint8))  # a wide crop: several tiles
    out = {"input_ids": torch.tensor([seg.ids]), "pixel_values": seg.images[0]["pixel_values"]}
    with pytest.raises(UserError, match="image token runs"):
        backend._split({**out, "pixel_values": out["pixel_values"][:-1]}, 1)  # a patch short


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_tiled_families_trajectory_logps_equal_one_forward(family, tmp_path):
    """Idefics3 / SmolVLM: every image is a run of tiles (2 x 2 sub-images + a global view of 16 px here); a
    batch pads rows with all-zero tiles, which the model drops."""
    adapter = load_adapter(build_family(family, tmp_path / family))
    assert isinstance(backend_for(adapter), TiledImageBackend)
    backend, trajs = _forced_rollout(adapter, TiledImageBackend)
    per_image = [im["pixel_values"].shape[0] for t in trajs for im in t.images]
    assert len(per_image) == 7 and all(n >= 1 for n in per_image)
    batch, _ = trajectory_batch(backend, trajs)
    pixels = batch["pixel_values"]  # (3, N, 3, 16, 16)
    real = pixels.flatten(2).abs().sum(-1) > 0  # (3, N)
    assert real.sum(1).tolist() == [sum(im["pixel_values"].shape[0] for im in t.images) for t in trajs]
    assert pixels.shape[1] == max(real.sum(1).tolist())  # padded to the row with the most tiles
    _assert_one_forward_parity(adapter, backend, trajs)


def test_llava_next_patches_trajectory_logps_equal_one_forward(tmp_path):
    """LLaVA-NeXT: every image is its best grid's patches plus a base view, so a zoom crop of another shape
    has another patch count (and token count); a batch pads images to the most patches, and the model
    counts each image's own from ``image_sizes``."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    adapter = load_adapter(build_family("llava_next", tmp_path / "llava_next"))
    assert isinstance(backend_for(adapter), PatchedImageBackend)
    backend, trajs = _forced_rollout(adapter, PatchedImageBackend)
    config = adapter.base_model.config
    per_image = [im["pixel_values"].shape[1] for t in trajs for im in t.images]
    expected = [
        image_size_to_num_patches(im["image_sizes"][0].tolist(), config.image_grid_pinpoints, 16)
        for t in trajs
        for im in t.images
    ]
    assert per_image == expected and len(set(per_image)) > 1  # crops of other shapes, other patch counts
    batch, _ = trajectory_batch(backend, trajs)
    assert batch["pixel_values"].shape[:2] == (7, max(per_image)) and batch["image_sizes"].shape == (7, 2)
    _assert_one_forward_parity(adapter, backend, trajs)


def test_unsupported_family_is_named(notevlm):
    class Other:
        family = "fuyu"

    with pytest.raises(Exception, match="does not support family 'fuyu'.*llava_next.*idefics3"):
        backend_for(Other())


@pytest.mark.parametrize("family", ["llava", "llava_next", "idefics3", "smolvlm"])
def test_image_placeholders_are_never_generated(family, tmp_path):
    """A policy that prefers the image placeholder above every other token still never emits it: one
    would be an image token with no image, and the next forward fails or misplaces the features. (A
    NoteVLM suppresses it in its own generation config; a transformers family's config does not.)"""
    adapter = load_adapter(build_family(family, tmp_path / family))
    backend = backend_for(adapter)
    image_token = adapter.base_model.config.image_token_id
    assert image_token in backend.placeholder_ids
    assert image_token not in (adapter.base_model.generation_config.suppress_tokens or [])

    def prefer_placeholder(module, args, out):
        out = out.clone()
        out[..., image_token] += 1e4
        return out

    prompt = backend.prompt(note_images(1, seed=1), "what colour")
    handle = adapter.model.lm_head.register_forward_hook(prefer_placeholder)
    try:
        for sampling in (Sampling(), Sampling(do_sample=True, temperature=1.0)):
            (turn,) = backend.generate([prompt], max_new_tokens=8, sampling=sampling)
            assert turn.ids and image_token not in turn.ids
    finally:
        handle.remove()


def test_notevlm_with_own_visibility_is_refused():
    adapter = tiny_notevlm()
    adapter.base_model.config.visibility = "own"
    with pytest.raises(Exception, match="needs a NoteVLM with visibility 'all'"):
        backend_for(adapter)


def test_sampled_free_rollout_logps_equal_one_forward(notevlm):
    """The model's own sampled turns (no script), temperature 0.7: recorded = recomputed log-probs."""
    backend = backend_for(notevlm)
    torch.manual_seed(0)
    cfg = LoopConfig(
        max_turns=2, max_new_tokens=10, max_tokens=16, sampling=Sampling(do_sample=True, temperature=0.7)
    )
    trajs = rollout(backend, _tasks() * 2, cfg)
    assert all(t.done for t in trajs) and all(1 <= t.policy_tokens <= 16 for t in trajs)
    batch, old = trajectory_batch(backend, trajs)
    with torch.no_grad():
        logps, mask = notevlm.token_logps(batch, temperature=0.7)
    torch.testing.assert_close(logps, old, atol=2e-5, rtol=0)
    for t in trajs:  # a turn's ids are the generated ids: what the prompt processor would never re-create
        prompt = notevlm.processor.prompt_ids(len(t.task.sources), prompt_text_of(t))
        assert t.ids[: t.prompt_length] == prompt


def prompt_text_of(traj) -> str:
    from rl.agent.loop import prompt_text
    from rl.agent.tools import TOOLS

    return prompt_text(traj.task, TOOLS, LoopConfig())


@pytest.mark.parametrize("loss_kind", ["policy", "sft"])
def test_gradient_is_exactly_zero_on_observation_logits(notevlm, loss_kind):
    backend, trajs = _forced_rollout(notevlm, NoteVLMBackend)
    batch, old = trajectory_batch(backend, trajs)
    captured = {}

    def keep(module, args, out):
        out.retain_grad()
        captured["logits"] = out  # (B, W, V): the last W columns of the sequence

    handle = notevlm.model.lm_head.register_forward_hook(keep)
    try:
        logps, mask = notevlm.token_logps(batch)
    finally:
        handle.remove()
    if loss_kind == "policy":
        advantages = torch.tensor([1.0, -0.5, 2.0])
        loss, _ = policy_loss(logps, old, advantages, mask)
    else:
        loss = -(logps * mask).sum() / mask.sum()
    loss.backward()
    grad = captured["logits"].grad  # (B, W, V)
    T, W = batch["input_ids"].shape[1], grad.shape[1]
    predicted = batch["response_mask"][:, T - W + 1 :]  # (B, W - 1): the token column c + 1 predicts
    per_column = grad[:, :-1].abs().sum(-1)  # (B, W - 1)
    observation = (predicted == 0) & (batch["attention_mask"][:, T - W + 1 :] == 1)
    assert int(observation.sum()) > 100
    assert bool((per_column[observation] == 0).all())  # exactly zero, not small
    assert bool((per_column[predicted == 1] > 0).all())
    assert bool((grad[:, -1] == 0).all())  # the last column predicts nothing
    notevlm.model.zero_grad(set_to_none=True)
