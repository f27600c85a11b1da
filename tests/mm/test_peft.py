"""PEFT presets and stage freezing: LoRA on the LM only, fusion saved whole, vision frozen."""

from __future__ import annotations

import re

import pytest
import torch

from mm.errors import UserError
from mm.model.peft_presets import (
    LoraPreset,
    apply_lora,
    enable_checkpointing,
    freeze_for_stage,
    lm_target_regex,
    lora_config,
    trainable_counts,
)
from tests.helpers.model import random_images, tiny_model, tiny_processor


def _batch():
    return tiny_processor()(
        [random_images(2), random_images(1, seed=1)],
        ["describe the note", "is there a cat"],
        ["a red cat", "yes"],
    )


@pytest.mark.parametrize("kind", ["mlp", "qformer", "resampler"])
def test_lora_targets_only_lm_linears(kind):
    model = tiny_model(fusion_kind=kind)
    regex = lm_target_regex(model)
    names = [n for n, _ in model.named_modules()]
    hits = [n for n in names if re.fullmatch(regex, n)]
    assert hits and all(n.startswith("model.language_model.layers.") for n in hits)
    leafs = {n.rsplit(".", 1)[-1] for n in hits}
    assert leafs == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(hits) == 7 * model.config.text_config.num_hidden_layers
    n_fusion = sum(p.numel() for p in model.fusion.parameters())
    peft_model = apply_lora(model)
    lora_layers = [n for n, _ in peft_model.named_modules() if n.endswith("lora_A")]
    assert len(lora_layers) == len(hits)
    assert not any("vision_tower" in n or ".fusion." in n for n in lora_layers)
    counts = trainable_counts(peft_model)
    assert counts["vision_tower"] == 0
    assert counts["fusion"] == n_fusion  # the trainable copy; PEFT keeps the original frozen
    r = LoraPreset().r
    expected_lora = sum(
        r * (m.in_features + m.out_features)
        for n, m in model.named_modules()
        if re.fullmatch(regex, n) and hasattr(m, "in_features")
    )
    assert counts["language_model"] == expected_lora


def test_fusion_suffix_clash_is_detected():
    model = tiny_model()
    model.vision_tower.add_module("late_fusion", torch.nn.Identity())  # PEFT would save it too
    with pytest.raises(ValueError, match="PEFT matches by suffix"):
        lora_config(model)
    assert lora_config(model, LoraPreset(save_fusion=False)).modules_to_save is None


def test_adapter_save_and_reload_identical_logits(tmp_path):
    from peft import PeftModel

    model = apply_lora(tiny_model(seed=1))
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    batch = _batch()
    for _ in range(2):  # move adapters and fusion away from init so the check means something
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        before = model(**batch).logits
        base_logits = tiny_model(seed=1)(**batch).logits
    assert not torch.allclose(before, base_logits)
    model.save_pretrained(tmp_path)
    saved = set(__import__("safetensors.torch").torch.load_file(tmp_path / "adapter_model.safetensors"))
    assert any("fusion" in k for k in saved) and not any("vision_tower" in k for k in saved)
    reloaded = PeftModel.from_pretrained(tiny_model(seed=1), tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, before)


@pytest.mark.parametrize("stage", ["align", "sft", "lora"])
def test_gradient_checkpointing_reentrant_has_grads(stage):
    model = tiny_model()
    if stage == "lora":
        model = apply_lora(model, LoraPreset(save_fusion=False), gradient_checkpointing=True)
    else:
        freeze_for_stage(model, stage)
        enable_checkpointing(model, use_reentrant=True)
    model.train()
    loss = model(**_batch(), use_cache=False).loss
    loss.backward()  # raises "element 0 of tensors does not require grad" if inputs lost their grad
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(p.grad is not None for p in trained.values())
    lm_grads = [p.grad.abs().sum() for n, p in trained.items() if "language_model" in n]
    assert (len(lm_grads) > 0) == (stage != "align")
    assert stage == "align" or any(g > 0 for g in lm_grads)  # (LoRA A gets zero grad while B is 0)


def test_freeze_for_stage_counts():
    model = tiny_model()
    n = {
        part: sum(p.numel() for p in getattr(model, part).parameters())
        for part in ("fusion", "language_model")
    }
    n["language_model"] += model.lm_head.weight.numel()  # the head trains with the LM
    align = freeze_for_stage(model, "align")
    assert align == {
        "vision_tower": 0,
        "fusion": n["fusion"],
        "language_model": 0,
        "other": 0,
        "total": n["fusion"],
    }
    sft = freeze_for_stage(model, "sft")
    assert sft["vision_tower"] == 0 and sft["language_model"] == n["language_model"]
    assert sft["total"] == n["fusion"] + n["language_model"]
    with pytest.raises(UserError, match="known stages: align, sft"):
        freeze_for_stage(model, "pretrain")
    with pytest.raises(TypeError, match="NoteVLMForConditionalGeneration"):
        freeze_for_stage(torch.nn.Linear(2, 2), "align")
