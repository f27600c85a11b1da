"""Smoke of benchmarks/notevlm_bench.py at tiny sizes: LLaVA gets NoteVLM's weights and computes the same
function (logits and greedy tokens), parameter counts differ only by CLIP's unused post_layernorm, and
the table prints every model."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "notevlm_bench.py")
TINY = [
    "--image-size", "16", "--patch-size", "8", "--vision-width", "16", "--vision-layers", "1",
    "--vision-heads", "2", "--hidden-size", "16", "--intermediate-size", "32", "--layers", "1",
    "--heads", "2", "--kv-heads", "1", "--vocab", "40", "--batch", "2", "--text-tokens", "3",
    "--new-tokens", "2", "--runs", "1", "--warmup", "0",
]  # fmt: skip


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("notevlm_bench", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _sizes(bench, **kw):
    base = dict(
        image_size=16, patch_size=8, vision_width=16, vision_layers=1, vision_heads=2, hidden_size=16,
        intermediate_size=32, layers=1, heads=2, kv_heads=1, vocab_size=40, batch=2, text_tokens=3,
    )  # fmt: skip
    base.update(kw)
    return bench.BenchSizes(**base)


def test_llava_with_notevlm_weights_is_the_same_function(bench):
    torch.manual_seed(0)
    s = _sizes(bench)
    notevlm, llava = bench.build_notevlm(s, "mlp"), bench.build_llava(s)
    only_llava = bench.copy_weights(notevlm, llava)
    assert only_llava == [
        "model.vision_tower.post_layernorm.bias",
        "model.vision_tower.post_layernorm.weight",
    ]
    batch = bench.make_batch(s)
    assert batch["input_ids"].shape == (2, 4 + 3)
    assert int((batch["input_ids"] == bench.IMAGE_TOKEN_ID).sum()) == 2 * 4
    assert int((batch["labels"] != -100).sum()) == 2 * 3
    diff, same = bench.parity(notevlm, llava, batch, new_tokens=3)
    assert diff < 1e-5
    assert same
    a, b = bench.part_counts(notevlm), bench.part_counts(llava)
    assert a["fusion"] == b["fusion"] == (16 * 16 + 16) + (16 * 16 + 16)
    assert a["lm"] == b["lm"] and a["lm_head"] == b["lm_head"] == 16 * 40
    assert b["vision"] - a["vision"] == 2 * 16  # post_layernorm weight + bias


def test_train_step_changes_weights_and_generation_length(bench):
    torch.manual_seed(0)
    s = _sizes(bench)
    model = bench.build_llava(s)
    batch = bench.make_batch(s)
    before = model.lm_head.weight.detach().clone()
    bench.train_step_fn(model, batch)()
    assert not torch.equal(before, model.lm_head.weight)
    notevlm = bench.build_notevlm(s, "mlp")
    before = notevlm.lm_head.weight.detach().clone()
    bench.train_step_fn(notevlm, batch, answer_only=True)()
    assert not torch.equal(before, notevlm.lm_head.weight)
    out = bench.generate_fn(bench.build_notevlm(s, "resampler"), batch, new_tokens=3)()
    assert out.shape == (2, 7 + 3)
    assert not (out[:, 7:] == bench.IMAGE_TOKEN_ID).any()


def test_table_prints_every_model(bench, capsys):
    assert bench.main([*TINY, "--profile", "--profile-rows", "3"]) == 0
    out = capsys.readouterr().out
    rows = ("| notevlm mlp |", "| notevlm qformer |", "| notevlm resampler |", "| llava |", "mm train loss |")
    for row in rows:
        assert row in out
    assert "same greedy tokens: True" in out
    assert "params NoteVLM(mlp) - LLaVA = -32" in out
    assert "load average" in out and "profile: train step, llava" in out
    assert "from the fastest run of each" in out


def test_bad_arguments_exit_2(bench, capsys):
    assert bench.main([*TINY, "--kinds", "mlp,perceiver"]) == 2
    assert "perceiver" in capsys.readouterr().err
    with pytest.raises(ValueError, match="multiple of --patch-size"):
        _sizes(bench, image_size=17)
