"""SFT building blocks in-process: gradient checkpointing (full and LoRA), the generation helpers."""

from __future__ import annotations

import pytest
import torch

from mm.config import load_config
from mm.train import common, sft
from tests.helpers.sft import make_world, tiny_train_config


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from mm.data.format import read_notes
    from mm.train.sft_data import SampleSet, load_note_images
    from mm.train.tasks import build_samples

    tmp = tmp_path_factory.mktemp("sft")
    world = make_world(tmp / "notes", notes=12)
    notes = read_notes(world, "train")[:4]
    return tmp, world, notes, SampleSet, load_note_images, build_samples


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_trains_without_grad_errors(setup, lora):
    tmp, world, notes, SampleSet, load_note_images, build_samples = setup
    path = tiny_train_config(
        tmp / f"c{lora}.yaml", train={"gradient_checkpointing": True}, lora={"enabled": lora}
    )
    cfg = load_config(sft.TrainConfig, path)
    common.seed_everything(0)
    model, proc, _ = sft.build_model_and_processor(cfg)
    model, counts = sft.prepare_trainable(model, cfg)
    assert counts["vision_tower"] == 0 and counts["fusion"] > 0
    ss = SampleSet(
        processor=proc, images=load_note_images(notes, world, proc.image_size), samples=build_samples(notes)
    )
    model.train()
    loss = model(**ss.batch([0, 1, 2])).loss
    loss.backward()
    fusion = [p for n, p in model.named_parameters() if "fusion" in n and p.requires_grad]
    assert all(p.grad is not None for p in fusion) and any(p.grad.abs().sum() > 0 for p in fusion)
    lm = [p for n, p in model.named_parameters() if "language_model" in n and p.requires_grad]
    assert lm and all(p.grad is not None for p in lm)
    if lora:
        assert all(
            "lora_" in n for n, p in model.named_parameters() if "language_model" in n and p.requires_grad
        )


@torch.no_grad()
def test_generate_helpers_match_model_generate(setup):
    from mm.eval.generate import answer_questions, generate_captions
    from mm.train.sft_data import to_unit

    tmp, world, notes, *_ = setup
    cfg = load_config(sft.TrainConfig, tiny_train_config(tmp / "g.yaml"))
    common.seed_everything(0)
    model, proc, _ = sft.build_model_and_processor(cfg)
    model.eval()
    from mm.train.sft_data import load_note_images

    images = [to_unit(im) for im in load_note_images(notes[:3], world, proc.image_size)]
    caps = generate_captions(model, proc, images, "Describe the note.", batch_size=2, max_new_tokens=5)
    assert len(caps) == 3 and all(isinstance(c, str) for c in caps)
    for i in range(3):  # batched, left-padded = one by one
        b = proc([images[i]], ["Describe the note."], padding_side="left")
        ids = model.generate(**b, max_new_tokens=5, do_sample=False, pad_token_id=proc.tokenizer.pad_token_id)
        assert proc.batch_decode(ids[:, b["input_ids"].shape[1] :])[0].strip() == caps[i]
    # notes are read from their folder
    assert (
        len(generate_captions(model, proc, notes[:2], "Describe the note.", max_new_tokens=3, root=world))
        == 2
    )
    ans = answer_questions(model, proc, [notes[0]] * 2, ["Is there a fork?", "Is there a cup?"], root=world)
    assert len(ans) == 2
    with pytest.raises(ValueError, match="one prompt per item"):
        answer_questions(model, proc, [notes[0]], ["a", "b"], root=world)


def test_train_vision_unfreezes_the_tower_and_rejects_lora_or_align(setup):
    tmp, world, notes, SampleSet, load_note_images, build_samples = setup
    cfg = load_config(sft.TrainConfig, tiny_train_config(tmp / "v.yaml", train={"train_vision": True}))
    common.seed_everything(0)
    model, proc, _ = sft.build_model_and_processor(cfg)
    model, counts = sft.prepare_trainable(model, cfg)
    n_vision = sum(p.numel() for p in model.vision_tower.parameters())
    assert counts["vision_tower"] == n_vision > 0 and counts["language_model"] > 0
    ss = SampleSet(
        processor=proc, images=load_note_images(notes, world, proc.image_size), samples=build_samples(notes)
    )
    model(**ss.batch([0, 1])).loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.vision_tower.parameters())
    for bad in ({"lora": {"enabled": True}}, {"train": {"train_vision": True, "stage": "align"}}):
        sections = {"train": {"train_vision": True}, **bad}
        with pytest.raises(Exception, match="train_vision needs train.stage: sft"):
            load_config(sft.TrainConfig, tiny_train_config(tmp / "bad.yaml", **sections))


def test_shipped_train_configs_load_with_the_tuned_recipe():
    from pathlib import Path

    from mm.train.compare import CompareConfig

    root = Path(__file__).resolve().parents[2] / "configs" / "mm"
    cfgs = {
        n: load_config(sft.TrainConfig, root / f"{n}.yaml")
        for n in ("align_tiny", "sft_tiny", "sft_lora_tiny")
    }
    assert cfgs["align_tiny"].train.stage == "align" and not cfgs["align_tiny"].train.train_vision
    assert not cfgs["sft_tiny"].train.train_vision and cfgs["sft_tiny"].tasks.kinds == ["caption"]
    assert cfgs["sft_lora_tiny"].lora.enabled and not cfgs["sft_lora_tiny"].train.train_vision
    assert all(c.eval.max_new_tokens >= 128 for c in cfgs.values())  # the longest note captions fit
    assert load_config(CompareConfig, root / "compare_tiny.yaml").sft.eval.max_new_tokens >= 128
