"""NoteVLM model: config checks, forward with image placeholders, cache argument names, save/load."""

from __future__ import annotations

import copy

import pytest
import torch

from mm.model import NoteProcessor, NoteVLMConfig, NoteVLMForConditionalGeneration
from tests.helpers.model import K, random_images, tiny_config, tiny_model, tiny_processor


def _batch(processor, answers=("a red cat", "yes")):
    return processor(
        [random_images(2), random_images(1, seed=1)],
        ["describe the note", "is there a cat in image 1"],
        list(answers) if answers else None,
    )


def test_config_defaults_and_round_trip(tmp_path):
    cfg = NoteVLMConfig(fusion_budget=8)
    assert cfg.model_type == "notevlm"
    assert cfg.text_config.model_type == "qwen2"
    assert cfg.get_text_config() is cfg.text_config
    cfg.save_pretrained(tmp_path)
    again = NoteVLMConfig.from_pretrained(tmp_path)
    assert again.fusion_budget == 8 and again.text_config.hidden_size == cfg.text_config.hidden_size


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"fusion_budget": 0}, "fusion_budget"),
        ({"max_images": 0}, "max_images"),
        ({"image_token_id": 10_000}, "outside the LM vocabulary"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NoteVLMConfig(**kwargs)


@pytest.mark.parametrize("kind", ["mlp", "qformer", "resampler"])
def test_forward_loss_and_shapes_each_fusion_kind(kind):
    model = tiny_model(fusion_kind=kind)
    batch = _batch(tiny_processor())
    out = model(**batch)
    B, T = batch["input_ids"].shape
    assert out.logits.shape == (B, T, model.config.text_config.vocab_size)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.fusion.parameters())


def test_images_change_only_positions_after_them():
    model = tiny_model()
    proc = tiny_processor()
    batch = _batch(proc, answers=None)
    other = dict(batch, pixel_values=torch.rand_like(batch["pixel_values"]))
    a, b = model(**batch).logits, model(**other).logits
    first_image = int((batch["input_ids"][0] == model.config.image_token_id).nonzero()[0, 0])
    assert torch.allclose(a[0, :first_image], b[0, :first_image])
    assert not torch.allclose(a[0, -1], b[0, -1])


def test_padded_image_slot_is_ignored():
    model = tiny_model()
    batch = _batch(tiny_processor(), answers=None)
    noisy = batch["pixel_values"].clone()
    noisy[1, 1] = torch.randn_like(noisy[1, 1])  # note 1 has one image; slot 1 is padding
    assert torch.equal(model(**batch).logits, model(**dict(batch, pixel_values=noisy)).logits)


def test_placeholder_count_mismatch_is_a_clear_error():
    model = tiny_model()
    batch = _batch(tiny_processor(), answers=None)
    ids = batch["input_ids"].clone()
    first = int((ids[0] == model.config.image_token_id).nonzero()[0, 0])
    ids[0, first] = 7  # one <image> fewer in note 0
    with pytest.raises(ValueError, match=rf"sample 0: found {2 * K - 1} `<image>` tokens.*2 image\(s\)"):
        model(**dict(batch, input_ids=ids))
    with pytest.raises(ValueError, match="no pixel_values"):
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])


@torch.no_grad()
def test_cache_accepted_under_both_names():
    model = tiny_model()
    batch = _batch(tiny_processor(), answers=None)
    prefill = model(**batch, use_cache=True)
    step = torch.tensor([[8], [9]])
    mask = torch.cat([batch["attention_mask"], torch.ones(2, 1, dtype=torch.long)], dim=1)
    new = model(input_ids=step, attention_mask=mask, cache=copy.deepcopy(prefill.cache)).logits
    old = model(input_ids=step, attention_mask=mask, past_key_values=copy.deepcopy(prefill.cache)).logits
    full_ids = torch.cat([batch["input_ids"], step], dim=1)
    full = model(**dict(batch, input_ids=full_ids, attention_mask=mask)).logits[:, -1:]
    assert torch.equal(new, old)
    torch.testing.assert_close(new, full, atol=1e-5, rtol=1e-5)


def test_save_and_auto_load_give_identical_logits(tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    model = tiny_model(fusion_kind="resampler")
    proc = tiny_processor()
    model.save_pretrained(tmp_path)
    proc.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    batch = _batch(proc)
    for auto in (AutoModelForImageTextToText, AutoModelForCausalLM):
        loaded = auto.from_pretrained(tmp_path).eval()
        assert isinstance(loaded, NoteVLMForConditionalGeneration)
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)
    proc2 = NoteProcessor.from_pretrained(tmp_path)
    batch2 = _batch(proc2)
    for key in ("input_ids", "labels", "pixel_values", "image_mask"):
        assert torch.equal(batch[key], batch2[key])


def test_too_many_images_is_rejected():
    model = tiny_model(max_images=1)
    batch = _batch(tiny_processor(), answers=None)
    with pytest.raises(ValueError, match="max_images=1"):
        model(**batch)


def test_config_fields_reach_the_model():
    cfg = tiny_config(fusion_budget=2)
    model = NoteVLMForConditionalGeneration(cfg)
    proc = NoteProcessor(
        tokenizer=tiny_processor().tokenizer, image_size=16, tokens_per_image=2, max_length=64
    )
    out = model(**_batch(proc))
    assert torch.isfinite(out.loss)
    assert model.generation_config.suppress_tokens == [cfg.image_token_id]


@pytest.mark.parametrize("family, tie", [("qwen2", True), ("llama", False)])
def test_tied_head_and_llama_family_round_trip(tmp_path, family, tie):
    from transformers import AutoModelForImageTextToText

    text = {
        "model_type": family,
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": tie,
    }
    model = tiny_model(text_config=text)  # the top-level flag follows text_config
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == tie
    model.save_pretrained(tmp_path)
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    assert (loaded.lm_head.weight is loaded.get_input_embeddings().weight) == tie
    batch = _batch(tiny_processor())
    assert torch.equal(model(**batch).logits, loaded(**batch).logits)
