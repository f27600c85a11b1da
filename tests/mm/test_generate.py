"""NoteVLM generation: cached greedy = uncached greedy, left-padded batches, images used at prefill only."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.model import random_images, tiny_model, tiny_processor

PROMPTS = ["describe the note", "is there a red cat in image 2", "describe"]
N_IMAGES = [2, 3, 1]


def _model(kind="mlp"):
    # A larger init spread so that greedy decoding of a random model does not repeat one token.
    text = {
        "model_type": "qwen2",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "initializer_range": 0.3,
    }
    return tiny_model(seed=3, fusion_kind=kind, text_config=text)


def _inputs(proc, idx):
    return proc(
        [random_images(N_IMAGES[i], seed=i) for i in idx], [PROMPTS[i] for i in idx], padding_side="left"
    )


@pytest.mark.parametrize("kind", ["mlp", "qformer"])
@torch.no_grad()
def test_cached_greedy_equals_uncached_greedy(kind):
    model, proc = _model(kind), tiny_processor()
    batch = _inputs(proc, [0, 1, 2])
    assert (batch["attention_mask"][:, 0] == 0).any()  # really left padded
    cached = model.generate(**batch, max_new_tokens=12, do_sample=False)
    uncached = model.generate(**batch, max_new_tokens=12, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)
    new = cached[:, batch["input_ids"].shape[1] :]
    assert len(set(new.flatten().tolist())) > 3  # a non-degenerate continuation was compared
    assert not (new == model.config.image_token_id).any()


@torch.no_grad()
def test_left_padded_batch_equals_one_by_one():
    model, proc = _model(), tiny_processor()
    batch = _inputs(proc, [0, 1, 2])
    together = model.generate(**batch, max_new_tokens=10, do_sample=False)[:, batch["input_ids"].shape[1] :]
    for i in range(3):
        single = _inputs(proc, [i])
        alone = model.generate(**single, max_new_tokens=10, do_sample=False)[
            :, single["input_ids"].shape[1] :
        ]
        assert torch.equal(together[i], alone[0]), f"note {i}"


@torch.no_grad()
def test_pixel_values_only_on_prefill():
    model, proc = _model(), tiny_processor()
    batch = _inputs(proc, [0, 1])
    calls = []
    hook = model.vision_tower.register_forward_hook(lambda mod, args, out: calls.append(out.shape))
    try:
        model.generate(**batch, max_new_tokens=6, do_sample=False)
        assert len(calls) == 1
        calls.clear()
        model.generate(**batch, max_new_tokens=6, do_sample=False, use_cache=False)
        assert len(calls) == 6  # uncached decoding recomputes the images every step
    finally:
        hook.remove()


@torch.no_grad()
def test_generated_text_decodes():
    model, proc = _model(), tiny_processor()
    batch = _inputs(proc, [0])
    out = model.generate(**batch, max_new_tokens=5, do_sample=False)
    text = proc.batch_decode(out[:, batch["input_ids"].shape[1] :])
    assert isinstance(text[0], str) and "<image>" not in text[0]
