"""The lean decode step gives the model forward's logits for the decoders it accepts; it declines others."""

from __future__ import annotations

import pytest
import torch

from rl.trainers.decode_step import lean_decode_step  # noqa: E402
from tests.helpers.model import tiny_model  # noqa: E402

PROMPT = torch.tensor([[0, 0, 5, 6, 7], [7, 8, 9, 3, 4], [0, 4, 4, 1, 2]])
PAD_MASK = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])


def _lm(kind: str = "qwen2", attn: str = "sdpa", **extra):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[kind]
    torch.manual_seed(0)
    cfg = config_cls(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3, **extra,
    )  # fmt: skip
    cfg._attn_implementation = attn
    return model_cls(cfg).eval()


def _compare(model, attention_mask: torch.Tensor, *, forward=None):
    """Prefill two caches, then 4 steps of the lean step vs the model forward on the same tokens."""
    from transformers import DynamicCache

    forward = forward or model
    text = model.config.get_text_config(decoder=True)
    step = lean_decode_step(model)
    assert step is not None
    position = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
    caches = [DynamicCache(config=text), DynamicCache(config=text)]
    padded = not bool(attention_mask.all())
    with torch.inference_mode():
        for c in caches:
            prefill_mask = attention_mask if padded else None
            forward(
                input_ids=PROMPT, attention_mask=prefill_mask, position_ids=position, cache=c, use_cache=True
            )
        mask2d, pos = attention_mask.clone(), position[:, -1:]
        for t in range(4):
            nxt = torch.tensor([[11 + t], [12], [13 + 2 * t]])  # (B, 1)
            mask2d, pos = torch.cat([mask2d, torch.ones(3, 1, dtype=mask2d.dtype)], 1), pos + 1
            mask4d = (
                mask2d.bool()[:, None, None, :] if padded else None
            )  # (B, 1, 1, T) as an SDPA model builds
            ref = forward(input_ids=nxt, attention_mask=mask4d, position_ids=pos, cache=caches[0],
                          use_cache=True, logits_to_keep=1).logits  # fmt: skip
            got = step(nxt, pos, caches[1], mask4d)
            assert got.shape == ref.shape
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("padded", [False, True])
def test_lean_step_equals_the_forward(kind, padded):
    _compare(_lm(kind), PAD_MASK if padded else torch.ones_like(PAD_MASK))


def test_lean_step_through_lora_and_notevlm():
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(_lm(), LoraConfig(r=2, target_modules=["q_proj", "v_proj", "down_proj"],
                                             init_lora_weights=False))  # fmt: skip
    _compare(lora, PAD_MASK)
    text = {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64}
    text.update(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
    vlm = tiny_model(seed=3, text_config=text).eval()
    _compare(vlm, PAD_MASK)  # text-only steps of a NoteVLM: its language model and lm_head


def test_other_models_use_the_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    assert lean_decode_step(_lm(attn="eager")) is None
    assert lean_decode_step(_lm(use_sliding_window=True, sliding_window=4, max_window_layers=0)) is None
    assert (
        lean_decode_step(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40))) is None
    )
