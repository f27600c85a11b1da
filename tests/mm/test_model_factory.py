"""NoteVLM from the shipped YAML specs and the project tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm.config import ConfigError
from mm.model.factory import build_notevlm, load_notevlm_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "mm"
SHRINK = [
    "vision.width=32",
    "vision.layers=1",
    "vision.heads=2",
    "text.hidden_size=32",
    "text.intermediate_size=64",
]


@pytest.mark.parametrize("name", ["notevlm_tiny.yaml", "notevlm_small.yaml"])
def test_shipped_specs_load(name):
    spec = load_notevlm_spec(CONFIGS / name)
    assert spec.max_length > spec.max_images * (spec.fusion.budget + 2)


def test_build_from_spec_matches_tokenizer_and_chat_template():
    spec = load_notevlm_spec(CONFIGS / "notevlm_tiny.yaml", [*SHRINK, "fusion.kind=mlp", "fusion.budget=4"])
    model, proc = build_notevlm(spec)
    tok = proc.tokenizer
    cfg = model.config
    assert cfg.text_config.vocab_size == len(tok)
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<image>") == proc.image_token_id
    assert proc.tokens_per_image == cfg.fusion_budget == 4
    assert proc.image_size == spec.vision.image_size
    # The processor's layout is the chat template's rendering with each <image> expanded to its block.
    prompt, answer = "Describe the note.", "A red cup and a fork."
    s = proc.encode([torch.rand(3, 64, 64), torch.rand(3, 64, 64)], prompt, answer)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "<image><image>" + prompt}, {"role": "assistant", "content": answer}],
        tokenize=False,
    )
    ref = tok(rendered, add_special_tokens=False)["input_ids"]
    block = [proc.im_start_id] + [proc.image_token_id] * 4 + [proc.im_end_id]
    expanded = [x for t in ref for x in (block if t == proc.image_token_id else [t])]
    assert s["input_ids"].tolist() == expanded
    out = model(**proc.collate([s]))
    assert torch.isfinite(out.loss)


def test_spec_errors_are_clear():
    with pytest.raises(ConfigError, match="unknown key"):
        load_notevlm_spec(CONFIGS / "notevlm_tiny.yaml", ["text.hiden_size=64"])
    with pytest.raises(ConfigError, match="cannot hold 4 images"):
        load_notevlm_spec(CONFIGS / "notevlm_tiny.yaml", ["max_length=40"])
    with pytest.raises(ConfigError, match="family"):
        load_notevlm_spec(CONFIGS / "notevlm_tiny.yaml", ["text.family=gpt2"])


def test_spec_takes_index_and_position_embeddings():
    base = [*SHRINK, "fusion.kind=mlp", "fusion.budget=4"]
    plain, _ = build_notevlm(load_notevlm_spec(CONFIGS / "notevlm_tiny.yaml", base))
    assert plain.model.image_index is None and plain.model.token_position is None
    on = ["image_index_embeddings=true", "token_position_embeddings=true", "max_images=6"]
    model, _ = build_notevlm(load_notevlm_spec(CONFIGS / "notevlm_tiny.yaml", [*base, *on]))
    assert model.config.image_index_embeddings and model.config.token_position_embeddings
    assert model.model.image_index.weight.shape == (6, 32)
    assert model.model.token_position is not None
