"""mm pretrain: model invariants, config errors, CLI smoke, kill + resume equality, torchrun (DDP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mm.cli import main as mm_main
from mm.config import ConfigError, load_config
from mm.train import common, pretrain

ROOT = Path(__file__).resolve().parents[2]
TEST_CFG = ROOT / "tests/configs/pretrain_test.yaml"
TINY_CFG = ROOT / "configs/mm/pretrain_tiny.yaml"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("world") / "notes"
    argv = ["data", "world", "--out", str(folder), "--notes", "80", "--seed", "0", "--workers", "1"]
    assert mm_main([*argv, "--no-progress"]) == 0  # in-process: no worker start-up
    return folder


@pytest.fixture(scope="module")
def splits(world):
    from mm.data.tokenizer import load_tokenizer

    tok = load_tokenizer()
    kw = {"tokenizer": tok, "max_images": 4, "max_len": 128}
    return pretrain.load_split(world, "train", **kw), pretrain.load_split(world, "test", **kw), len(tok)


def test_configs_load_and_unknown_key_fails():
    cfg = load_config(pretrain.PretrainConfig, TINY_CFG)
    assert cfg.loss.kind == "clip" and cfg.data.eval_notes == 1000
    with pytest.raises(ConfigError, match="valid keys"):
        load_config(pretrain.PretrainConfig, TEST_CFG, ["train.stepz=3"])
    with pytest.raises(ConfigError, match="loss.kind"):
        load_config(pretrain.PretrainConfig, TEST_CFG, ["loss.kind=triplet"])
    with pytest.raises(ConfigError, match="bag of embeddings"):
        load_config(pretrain.PretrainConfig, TEST_CFG, ["model.text.layers=0", "model.text.pooling=eos"])
    with pytest.raises(ConfigError, match="fusion kind"):
        load_config(pretrain.PretrainConfig, TEST_CFG, ["model.fusion.kind=linear"])


def test_cli_unknown_key_exits_2_and_writes_nothing(tmp_path, capsys):
    rc = mm_main(
        ["pretrain", "--config", str(TEST_CFG), "--out", str(tmp_path / "o"), "--set", "optim.lrr=1"]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "lrr" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_model_ignores_padded_slots(splits):
    train, _, vocab = splits
    cfg = load_config(pretrain.PretrainConfig, TEST_CFG)
    torch.manual_seed(0)
    model = pretrain.NoteTextModel(cfg=cfg.model, loss=cfg.loss, vocab_size=vocab).eval()
    batch = train.batch(list(range(8)))
    out = model(batch)
    noisy = dict(
        batch, pixel_values=batch["pixel_values"] + 5.0 * (~batch["image_mask"])[..., None, None, None]
    )
    torch.testing.assert_close(model(noisy)["note"], out["note"])
    assert out["note"].shape == (8, cfg.model.embed_dim) and out["text"].shape == (8, cfg.model.embed_dim)
    loss = pretrain.contrastive_loss(
        out, batch["image_mask"], log_scale=model.log_scale, logit_bias=None, cfg=cfg.loss
    )
    assert torch.isfinite(loss) and loss.item() > 0


@pytest.mark.parametrize(
    "overrides",
    [["loss.kind=siglip"], ["loss.multi_positive=true", "loss.label_smoothing=0.1"], ["model.text.layers=0"]],
)
def test_loss_variants_train_one_step(splits, tmp_path, overrides):
    train, test, vocab = splits
    cfg = load_config(pretrain.PretrainConfig, TEST_CFG, ["train.steps=1", *overrides])
    res = pretrain.train(
        cfg, out_dir=tmp_path, train_data=train, eval_data=test, vocab_size=vocab, show_progress=False
    )
    rec = common.read_metrics(tmp_path / "metrics.jsonl")[-1]
    assert res.step == 1 and torch.isfinite(torch.tensor(rec["loss"]))


def test_fixed_temperature_stays_fixed(splits, tmp_path):
    train, test, vocab = splits
    cfg = load_config(
        pretrain.PretrainConfig,
        TEST_CFG,
        ["loss.learn_temperature=false", "loss.init_temperature=0.05", "train.steps=1"],
    )
    pretrain.train(
        cfg, out_dir=tmp_path, train_data=train, eval_data=test, vocab_size=vocab, show_progress=False
    )
    temps = [r["temperature"] for r in common.read_metrics(tmp_path / "metrics.jsonl")]
    assert temps == [pytest.approx(0.05, abs=1e-7)]  # after an optimizer step


def test_cli_smoke_two_steps(world, tmp_path):
    out = tmp_path / "run"
    rc = mm_main(
        ["pretrain", "--config", str(TEST_CFG), "--out", str(out), "--data", str(world), "--no-progress"]
    )
    assert rc == 0
    recs = common.read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2]
    assert "eval/text2note_R@1" in recs[-1] and 0.0 <= recs[-1]["eval/text2note_R@1"] <= 1.0
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in common.list_checkpoints(out / "checkpoints")] == [
        "step-00000001",
        "step-00000002",
    ]
    result = json.loads((out / "result.json").read_text())
    assert result["step"] == 2 and result["eval_notes"] >= 1 and 0.0 <= result["text2note_R@1"] <= 1.0
    # a second run with the same --out resumes at step 2 and does nothing more
    assert (
        mm_main(
            ["pretrain", "--config", str(TEST_CFG), "--out", str(out), "--data", str(world), "--no-progress"]
        )
        == 0
    )
    assert [r["step"] for r in common.read_metrics(out / "metrics.jsonl")] == [1, 2]
    # resuming with a different model is refused
    rc = mm_main(
        [
            "pretrain",
            "--config",
            str(TEST_CFG),
            "--out",
            str(out),
            "--data",
            str(world),
            "--set",
            "model.embed_dim=8",
        ]
    )
    assert rc == 2


def test_cli_missing_data_folder(tmp_path, capsys):
    rc = mm_main(
        ["pretrain", "--config", str(TEST_CFG), "--out", str(tmp_path / "o"), "--data", str(tmp_path / "no")]
    )
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def _strip_time(recs):
    return [{k: v for k, v in r.items() if k not in ("time_s", "cpu_s", "step_s")} for r in recs]


@pytest.mark.slow
def test_kill_and_resume_gives_identical_run(splits, tmp_path):
    train, test, vocab = splits
    cfg = load_config(
        pretrain.PretrainConfig, TEST_CFG, ["train.steps=4", "train.eval_every=2", "train.checkpoint_every=2"]
    )
    kw = {"train_data": train, "eval_data": test, "vocab_size": vocab, "show_progress": False}
    straight = pretrain.train(cfg, out_dir=tmp_path / "a", **kw)
    pretrain.train(
        cfg, out_dir=tmp_path / "b", stop_after=3, **kw
    )  # killed after step 3 (last checkpoint: 2)
    assert common.find_last_checkpoint(tmp_path / "b/checkpoints").name == "step-00000002"
    torch.manual_seed(123)  # a fresh process has other RNG state
    resumed = pretrain.train(cfg, out_dir=tmp_path / "b", **kw)
    assert resumed.metrics == straight.metrics
    wa = load_file(tmp_path / "a/checkpoints/step-00000004/model.safetensors")
    wb = load_file(tmp_path / "b/checkpoints/step-00000004/model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ma = _strip_time(common.read_metrics(tmp_path / "a/metrics.jsonl"))
    mb = _strip_time(common.read_metrics(tmp_path / "b/metrics.jsonl"))
    assert ma == mb


@pytest.mark.slow
def test_torchrun_two_processes_matches_single_process(world, splits, tmp_path):
    """DDP (gloo): step-1 loss on 2 ranks x 4 notes equals the single-process loss on 8 notes."""
    train, test, vocab = splits
    cfg = load_config(pretrain.PretrainConfig, TEST_CFG, ["train.steps=1"])
    pretrain.train(
        cfg,
        out_dir=tmp_path / "single",
        train_data=train,
        eval_data=test,
        vocab_size=vocab,
        show_progress=False,
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "mm", "pretrain", "--config", str(TEST_CFG), "--data", str(world), "--no-progress",
         "--set", "train.steps=1", "--out", str(tmp_path / "ddp")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    a = common.read_metrics(tmp_path / "single/metrics.jsonl")[0]
    b = common.read_metrics(tmp_path / "ddp/metrics.jsonl")[0]
    assert abs(a["loss"] - b["loss"]) < 1e-5
    assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * max(1.0, a["grad_norm"])
    assert a["eval/text2note_R@1"] == b["eval/text2note_R@1"]


def test_bag_of_embeddings_text_encoder_is_masked_mean():
    from mm.train.text_encoder import TextEncoder, TextEncoderConfig

    torch.manual_seed(0)
    enc = TextEncoder(cfg=TextEncoderConfig(width=8, layers=0, heads=2, max_len=6), vocab_size=10).double()
    ids = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 0, 0, 0]])
    am = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    x = enc.norm(enc.tok(ids) + enc.pos[:5])  # (2, 5, 8)
    expect = torch.stack([x[0, :3].mean(0), x[1, :2].mean(0)])  # (2, 8)
    torch.testing.assert_close(enc(ids, am), expect, rtol=0, atol=1e-12)
    other_pad = ids.masked_fill(am == 0, 7)
    torch.testing.assert_close(enc(other_pad, am), expect, rtol=0, atol=1e-12)
    assert enc.blocks is None


def test_token_conv_binds_neighbours_and_ignores_padding():
    from mm.train.text_encoder import TextEncoder, TextEncoderConfig

    torch.manual_seed(0)
    cfg = TextEncoderConfig(width=8, layers=0, heads=2, max_len=6, conv_kernel=3)
    enc = TextEncoder(cfg=cfg, vocab_size=10).double()
    ids = torch.tensor([[1, 2, 3, 4, 0]])
    am = torch.tensor([[1, 1, 1, 1, 0]])
    e = enc.tok(ids) + enc.pos[:5]  # (1, 5, 8)
    w, b = enc.conv.weight, enc.conv.bias  # (8, 8, 3), (8,)
    h = e * am[..., None]
    padded = torch.cat([torch.zeros(1, 1, 8, dtype=h.dtype), h, torch.zeros(1, 1, 8, dtype=h.dtype)], 1)
    conv = torch.stack([sum(padded[0, t + j] @ w[:, :, j].T for j in range(3)) + b for t in range(5)])
    x = enc.norm(e[0] + torch.nn.functional.gelu(conv))  # (5, 8)
    torch.testing.assert_close(enc(ids, am)[0], x[:4].mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(enc(ids.masked_fill(am == 0, 7), am), enc(ids, am), rtol=0, atol=1e-12)
    swapped = torch.tensor([[2, 1, 3, 4, 0]])  # same bag, different order: no longer the same vector
    assert not torch.allclose(enc(swapped, am), enc(ids, am))
    with pytest.raises(ValueError, match="conv_kernel"):
        TextEncoderConfig(conv_kernel=2)


def test_tag_loss_golden_and_masked():
    import math

    logits = torch.tensor([[[0.0, 2.0], [5.0, -5.0]]], dtype=torch.float64)  # (1, 2, 2)
    tags = torch.tensor([[[1, 0], [1, 1]]], dtype=torch.bool)
    # image 0 only: mean of BCE(0, 1) = ln 2 and BCE(2, 0) = ln(1 + e^2)
    first = (math.log(2.0) + math.log1p(math.exp(2.0))) / 2
    assert pretrain.tag_loss(logits, tags, torch.tensor([[True, False]])).item() == pytest.approx(
        first, abs=1e-12
    )
    second = (math.log1p(math.exp(-5.0)) + math.log1p(math.exp(5.0))) / 2  # BCE(5, 1), BCE(-5, 1)
    both = pretrain.tag_loss(logits, tags, torch.tensor([[True, True]])).item()
    assert both == pytest.approx((first + second) / 2, abs=1e-12)


def test_tag_logits_are_the_max_of_per_token_logits():
    """Multiple-instance tagging: an image's logit for a class is its best token's, padding stays 0."""
    cfg = load_config(pretrain.PretrainConfig, TEST_CFG, [])
    torch.manual_seed(0)
    model = pretrain.NoteTextModel(cfg=cfg.model, loss=cfg.loss, vocab_size=32, num_tags=5).eval()
    S = cfg.model.vision.image_size
    px = torch.rand(2, 2, 3, S, S)
    mask = torch.tensor([[True, True], [True, False]])
    with torch.no_grad():
        _, logits = model.encode_images(px, mask, tags=True)  # (2, 2, 5)
        tokens, tmask = model.fusion(model.vision(px, mask), mask)  # (2, 2, K, D), (2, 2, K)
        per_token = model.tag_head(tokens)  # (2, 2, K, 5)
    for b, n in ((0, 0), (0, 1), (1, 0)):
        want = per_token[b, n][tmask[b, n].bool()].amax(0)
        torch.testing.assert_close(logits[b, n], want)
    assert torch.equal(logits[1, 1], torch.zeros(5))


@pytest.mark.slow
def test_tags_follow_the_objects_and_train(world, splits, tmp_path):
    from mm.data.format import read_notes
    from mm.data.tokenizer import load_tokenizer
    from mm.errors import UserError
    from mm.world.vocab import CATEGORY_NAMES

    _, test, vocab = splits
    cfg = load_config(pretrain.PretrainConfig, TEST_CFG, ["train.steps=2", "loss.tag_weight=1.0"])
    classes = pretrain.tag_classes(cfg)
    assert classes == list(CATEGORY_NAMES)
    assert pretrain.tag_classes(load_config(pretrain.PretrainConfig, TEST_CFG, [])) is None
    kw = {"tokenizer": load_tokenizer(), "max_images": 4, "max_len": 128}
    train = pretrain.load_split(world, "train", tag_classes=classes, **kw)
    notes = [n for n in read_notes(world) if n.split == "train"]
    for i in (0, len(notes) - 1):
        for k in range(4):
            want = set() if k >= len(notes[i].objects) else {o.category for o in notes[i].objects[k]}
            assert {classes[c] for c in train.tags[i, k].nonzero().flatten().tolist()} == want
    pretrain.train(
        cfg, out_dir=tmp_path, train_data=train, eval_data=test, vocab_size=vocab, show_progress=False
    )
    rec = common.read_metrics(tmp_path / "metrics.jsonl")[-1]
    assert rec["step"] == 2 and 0.0 < rec["tag_loss"] < 1.0
    assert rec["loss"] == pytest.approx(rec["contrastive_loss"] + rec["tag_loss"], rel=1e-6)
    # a tagger only: the contrastive loss is still logged but does not count
    only = load_config(
        pretrain.PretrainConfig,
        TEST_CFG,
        ["train.steps=1", "loss.tag_weight=2.0", "loss.contrastive_weight=0"],
    )
    pretrain.train(
        only, out_dir=tmp_path / "t", train_data=train, eval_data=test, vocab_size=vocab, show_progress=False
    )
    rec = common.read_metrics(tmp_path / "t" / "metrics.jsonl")[-1]
    assert rec["contrastive_loss"] > 0 and rec["loss"] == pytest.approx(2.0 * rec["tag_loss"], rel=1e-6)
    with pytest.raises(ValueError, match="nothing to train"):
        load_config(pretrain.PretrainConfig, TEST_CFG, ["loss.contrastive_weight=0"])
    with pytest.raises(UserError, match="tag_classes"):
        pretrain.train(
            cfg,
            out_dir=tmp_path / "b",
            train_data=test,
            eval_data=test,
            vocab_size=vocab,
            show_progress=False,
        )
    with pytest.raises(Exception, match="not a tag class"):
        pretrain.load_split(world, "train", tag_classes=["fork"], **kw)
