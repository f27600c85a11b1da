"""NoteVLM on CUDA (skipped without a GPU): bf16 training step, cached = uncached greedy, reload on GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.model import random_images, tiny_model, tiny_processor

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def _batch(side="right", answers=True):
    return tiny_processor()(
        [random_images(2), random_images(1, seed=1), random_images(4, seed=2)],
        ["describe the note", "is there a cat in image 1", "describe"],
        ["a red cat", "yes", "a dog and a fork"] if answers else None,
        padding_side=side,
    )


def _to(batch, **kw):
    return {k: v.to(CUDA, **kw) if v.is_floating_point() else v.to(CUDA) for k, v in batch.items()}


@pytest.mark.parametrize("kind", ["mlp", "qformer", "resampler"])
def test_bf16_autocast_training_step(kind):
    model = tiny_model(fusion_kind=kind).to(CUDA).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = _to(_batch())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_cached_equals_uncached_on_gpu(dtype):
    model = tiny_model(fusion_kind="qformer").to(CUDA, dtype).eval()
    batch = _to(_batch("left", answers=False), dtype=dtype)
    a = model.generate(**batch, max_new_tokens=10, do_sample=False)
    b = model.generate(**batch, max_new_tokens=10, do_sample=False, use_cache=False)
    if dtype == torch.float32:
        assert torch.equal(a, b)
    else:  # bf16: cached and full-sequence attention round differently; the first token must agree
        n = batch["input_ids"].shape[1]
        assert torch.equal(a[:, n], b[:, n])


@torch.no_grad()
def test_reload_on_gpu_restores_buffers(tmp_path):
    from transformers import AutoModelForImageTextToText

    model = tiny_model(fusion_kind="resampler").to(CUDA).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path, device_map="cuda").eval()
    assert all(b.device.type == "cuda" for b in loaded.buffers())
    batch = _to(_batch())
    torch.testing.assert_close(model(**batch).logits, loaded(**batch).logits, rtol=0, atol=0)


def test_lora_with_checkpointing_on_gpu():
    from mm.model.peft_presets import apply_lora, trainable_counts

    model = apply_lora(tiny_model().to(CUDA), gradient_checkpointing=True).train()
    loss = model(**_to(_batch()), use_cache=False).loss
    loss.backward()
    assert trainable_counts(model)["vision_tower"] == 0
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
