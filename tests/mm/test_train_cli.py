"""`mm train`: two-step smoke runs (align, SFT full, SFT LoRA), resume equality, config errors."""

from __future__ import annotations

import json

import pytest
import torch

from mm.cli import main
from tests.helpers.sft import TINY_VISION, make_world, tiny_train_config


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("world") / "notes")


def _run(cfg, out, world, *extra):
    return main(
        ["train", "--config", str(cfg), "--out", str(out), "--data", str(world), "--no-progress", *extra]
    )


def _check_run(out, steps=2):
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    final = recs[-1]
    for k in ("loss", "lr", "eval/caption_loss", "eval/recall", "eval/chair_i", "eval/precision"):
        assert k in final and final[k] == final[k], k  # present and not NaN
    assert (out / "curves.png").stat().st_size > 1000
    assert (out / "model" / "config.json").is_file() and (out / "model" / "note_processor.json").is_file()
    return json.loads((out / "result.json").read_text())


def test_align_then_sft_full_then_lora(tmp_path, world):
    from mm.model import NoteProcessor, NoteVLMForConditionalGeneration

    align = tmp_path / "align"
    cfg = tiny_train_config(tmp_path / "align.yaml", train={"stage": "align"}, tasks={"kinds": ["caption"]})
    assert _run(cfg, align, world) == 0
    res = _check_run(align)
    t = res["trainable"]
    assert t["vision_tower"] == 0 and t["language_model"] == 0 and t["fusion"] > 0

    sft = tmp_path / "sft"
    cfg = tiny_train_config(tmp_path / "sft.yaml")
    assert _run(cfg, sft, world, "--set", f"init.model={align / 'model'}") == 0
    res = _check_run(sft)
    assert res["trainable"]["language_model"] > 0 and res["trainable"]["vision_tower"] == 0
    assert res["origin"]["init"] == "model"
    # the align model's frozen vision tower is unchanged by SFT; its fusion moved
    a = NoteVLMForConditionalGeneration.from_pretrained(str(align / "model"))
    s = NoteVLMForConditionalGeneration.from_pretrained(str(sft / "model"))
    for (n, p), q in zip(a.vision_tower.named_parameters(), s.vision_tower.parameters()):
        assert torch.equal(p, q), n
    assert any(not torch.equal(p, q) for p, q in zip(a.fusion.parameters(), s.fusion.parameters()))
    assert NoteProcessor.from_pretrained(sft / "model").tokens_per_image == 4

    lora = tmp_path / "lora"
    cfg = tiny_train_config(tmp_path / "lora.yaml", lora={"enabled": True, "r": 4})
    assert _run(cfg, lora, world, "--set", f"init.model={align / 'model'}") == 0
    res = _check_run(lora)
    assert res["trainable"]["vision_tower"] == 0 and 0 < res["trainable"]["language_model"] < 20000
    assert (lora / "adapter" / "adapter_config.json").is_file()
    merged = NoteVLMForConditionalGeneration.from_pretrained(str(lora / "model"))  # merged: a plain NoteVLM
    assert not any("lora" in n for n, _ in merged.named_parameters())


@pytest.mark.parametrize("group_by_length", [False, True])
def test_resume_gives_the_same_final_weights(tmp_path, world, group_by_length):
    from safetensors.torch import load_file

    from mm.config import load_config
    from mm.data.format import read_notes
    from mm.train import sft

    train_cfg = {"steps": 4, "checkpoint_every": 2, "eval_every": 4, "group_by_length": group_by_length}
    cfg_path = tiny_train_config(tmp_path / "c.yaml", train=train_cfg, eval={"questions": 0})
    assert _run(cfg_path, tmp_path / "straight", world) == 0
    cfg = load_config(sft.TrainConfig, cfg_path)
    train, test = read_notes(world, "train"), read_notes(world, "test")
    kw = dict(train_notes=train, eval_notes=test, root=world, show_progress=False)
    sft.train(cfg, out_dir=tmp_path / "killed", stop_after=2, **kw)
    assert [p.name for p in (tmp_path / "killed" / "checkpoints").iterdir()] == ["step-00000002"]
    assert _run(cfg_path, tmp_path / "killed", world) == 0  # resumes from step 2
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "step-00000004" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "checkpoints" / "step-00000004" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra = json.loads((tmp_path / "straight" / "result.json").read_text())
    rb = json.loads((tmp_path / "killed" / "result.json").read_text())
    assert ra["caption_loss"] == rb["caption_loss"] and ra["sample_captions"] == rb["sample_captions"]
    la = [json.loads(x)["loss"] for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["loss"] for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert la == lb


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.stpes=3", "unknown key"),
        ("train.stage=pretrain", "train.stage must be one of"),
        ("lora.enabled=true", "lora.enabled needs train.stage: sft"),
        ("tasks.kinds=[captions]", "tasks.kinds must be"),
        ("init.model=/nonexistent/model", "has no config.json"),
    ],
)
def test_config_errors_exit_2_with_one_line(tmp_path, world, capsys, override, message):
    cfg = tiny_train_config(tmp_path / "c.yaml", train={"stage": "align"} if "lora" in override else {})
    assert _run(cfg, tmp_path / "out", world, "--set", override) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "out" / "model").exists()


def test_pretrain_mismatch_is_a_clear_error(tmp_path, world, capsys):
    cfg = tiny_train_config(tmp_path / "c.yaml")
    assert _run(cfg, tmp_path / "out", world, "--set", f"init.pretrain={tmp_path}") == 2
    assert "neither a checkpoint folder nor a run folder" in capsys.readouterr().err


def test_align_starts_from_an_infonce_checkpoint(tmp_path, world, capsys):
    import yaml
    from safetensors.torch import load_file

    from mm.model import NoteVLMForConditionalGeneration

    pre_cfg = tmp_path / "pre.yaml"
    pre_cfg.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "vision": {**TINY_VISION, "image_size": 64, "patch_size": 16},
                    "fusion": {"kind": "qformer", "budget": 4, "layers": 1, "heads": 2},
                    "text": {"width": 32, "layers": 1, "heads": 2, "max_len": 128},
                    "d_model": 32,
                    "embed_dim": 16,
                },
                "optim": {"warmup_steps": 1},
                "train": {"steps": 2, "batch_size": 8, "eval_every": 2, "checkpoint_every": 2},
            }
        )
    )  # fmt: skip
    pre = tmp_path / "pre"
    assert (
        main(["pretrain", "--config", str(pre_cfg), "--out", str(pre), "--data", str(world), "--no-progress"])
        == 0
    )
    cfg = tiny_train_config(tmp_path / "a.yaml", train={"stage": "align", "steps": 1})
    align = tmp_path / "align"
    assert _run(cfg, align, world, "--set", f"init.pretrain={pre}", "--set", "optim.lr=0.0") == 0
    res = json.loads((align / "result.json").read_text())
    assert res["origin"]["init"] == "pretrain" and res["origin"]["tensors"]["fusion"] > 0
    model = NoteVLMForConditionalGeneration.from_pretrained(str(align / "model"))
    assert model.config.fusion_kind == "qformer" and model.config.vision_config["image_size"] == 64
    state = load_file(str(pre / "checkpoints" / "step-00000002" / "model.safetensors"))
    for prefix, part in (("vision.", model.vision_tower), ("fusion.", model.fusion)):
        for k, v in part.state_dict().items():
            assert torch.equal(state[prefix + k], v), prefix + k  # lr 0: weights are the pretrained ones
    # an LM whose width differs from the pretraining d_model cannot take the fusion: one clear line
    bad = _run(
        cfg, tmp_path / "bad", world, "--set", f"init.pretrain={pre}", "--set", "model.text.hidden_size=64"
    )
    assert bad == 2 and "set model.text.hidden_size=32" in capsys.readouterr().err
