"""`mm compare-fusion`: a two-step run of the three kinds writes a complete table; config errors."""

from __future__ import annotations

import json

import pytest
import yaml

from mm.cli import main
from tests.helpers.sft import TINY_TEXT, TINY_VISION, make_world

VISION = {
    **TINY_VISION,
    "image_size": 64,
    "patch_size": 16,
}  # pretraining reads the world's 64x64 images as is


def _config(path):
    pre = {
        "model": {
            "vision": dict(VISION),
            "fusion": {"kind": "mlp", "budget": 4, "layers": 1, "heads": 2},
            "text": {"width": 32, "layers": 1, "heads": 2, "max_len": 96},
            "d_model": 32,
            "embed_dim": 32,
        },
        "optim": {"warmup_steps": 1},
        "train": {"steps": 2, "batch_size": 8, "eval_every": 2, "checkpoint_every": 2},
        "data": {"eval_notes": 5},
    }
    sft = {
        "model": {"vision": dict(VISION), "text": dict(TINY_TEXT), "max_length": 200},
        "tasks": {"questions_per_note": 1},
        "optim": {"warmup_steps": 1},
        "train": {"steps": 2, "batch_size": 4, "eval_every": 2, "checkpoint_every": 2},
        "eval": {"notes": 2, "questions": 2, "batch_size": 2, "max_new_tokens": 4},
    }
    cfg = {"budget": 4, "pretrain": pre, "align_steps": 1, "sft": sft}
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_compare_three_kinds_two_steps(tmp_path):
    world = make_world(tmp_path / "notes", notes=32)
    out = tmp_path / "cmp"
    assert main(["compare-fusion", "--config", str(_config(tmp_path / "c.yaml")), "--out", str(out),
                 "--data", str(world)]) == 0  # fmt: skip
    rows = json.loads((out / "compare.json").read_text())
    assert [r["kind"] for r in rows] == ["mlp", "qformer", "resampler"]
    for r in rows:
        assert r["budget"] == 4 and 0.0 <= r["r_at_1"] <= 1.0 and r["caption_loss"] > 0
        assert 4 <= r["tokens_per_note"] <= 16 and r["fusion_params"] > 0 and r["step_seconds"] > 0
        for stage in ("pretrain", "align", "sft"):
            assert (out / r["kind"] / stage / "metrics.jsonl").is_file()
        cfg = json.loads((out / r["kind"] / "sft" / "model" / "config.json").read_text())
        assert cfg["fusion_kind"] == r["kind"] and cfg["fusion_budget"] == 4
    assert len({r["fusion_params"] for r in rows}) == 3  # three different modules were built
    md = (out / "compare.md").read_text()
    assert md.count("\n| ") == 4 and "R@1" in md and "| resampler | 4 |" in md


@pytest.mark.parametrize(
    "override, message",
    [
        ("kinds=[mlp, conv]", "kinds must be a non-empty subset"),
        ("sft.model.text.hidden_size=64", "must equal"),
    ],
)
def test_compare_config_errors(tmp_path, capsys, override, message):
    cfg = _config(tmp_path / "c.yaml")
    rc = main(["compare-fusion", "--config", str(cfg), "--out", str(tmp_path / "o"), "--set", override])
    assert rc == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_compare_scopes_and_visibility_columns(tmp_path):
    world = make_world(tmp_path / "notes", notes=32)
    out = tmp_path / "cmp"
    sets = ["kinds=[resampler]", "scopes=[image, note]", "visibilities=[all, own]"]
    assert main(["compare-fusion", "--config", str(_config(tmp_path / "c.yaml")), "--out", str(out),
                 "--data", str(world), "--set", *sets]) == 0  # fmt: skip
    rows = json.loads((out / "compare.json").read_text())
    assert [(r["scope"], r["visibility"]) for r in rows] == [
        ("image", "all"),
        ("image", "own"),
        ("note", "all"),
        ("note", "own"),
    ]
    for r in rows:
        for k in ("recall_first", "recall_later", "chair_i", "pope_f1", "tokens_per_note", "step_seconds"):
            assert k in r
        assert 0.0 <= r["pope_f1"] <= 1.0 and r["step_seconds"] > 0 and r["tokens_per_note"] >= 4
        cfg = json.loads((out / compare_folder(r) / "sft" / "model" / "config.json").read_text())
        assert cfg["visibility"] == r["visibility"]
        assert cfg["fusion_kwargs"].get("scope", "image") == r["scope"]
    assert not (out / "resampler-own" / "pretrain").exists()  # "own" reuses the "all" pretraining
    md = (out / "compare.md").read_text()
    assert "recall 1st photo" in md and "POPE F1" in md and "| resampler | 4 | image | note | own | 1 |" in md


def compare_folder(row, note_budget=None):
    from mm.train.compare import variant_folder

    return variant_folder(row["kind"], row["scope"], row["visibility"], row["seed"], note_budget)


@pytest.mark.slow
def test_compare_note_budget_rows(tmp_path):
    """note_budget=6: the note-scope row costs 6 tokens per note whatever its photos; image scope K each."""
    world = make_world(tmp_path / "notes", notes=32)
    out = tmp_path / "cmp"
    sets = ["kinds=[qformer]", "scopes=[image, note]", "note_budget=6"]
    assert main(["compare-fusion", "--config", str(_config(tmp_path / "c.yaml")), "--out", str(out),
                 "--data", str(world), "--set", *sets]) == 0  # fmt: skip
    rows = json.loads((out / "compare.json").read_text())
    img, note = rows
    assert (img["budget"], img["budget_per"], note["budget"], note["budget_per"]) == (4, "image", 6, "note")
    assert note["tokens_per_note"] == 6 and img["tokens_per_note"] > 4  # the 2 held-out notes have 2+ photos
    cfg = json.loads((out / compare_folder(note, 6) / "sft" / "model" / "config.json").read_text())
    assert cfg["fusion_budget"] == 6 and cfg["fusion_kwargs"]["budget_per"] == "note"
    assert (out / "qformer-note6" / "sft" / "model" / "note_processor.json").read_text().count('"note"') == 1
    assert "| qformer | 6 | note | note | all | 1 | 6.0 |" in (out / "compare.md").read_text()


def test_note_budget_config_and_stage_configs():
    from mm.train.compare import CompareConfig, stage_configs, variant_folder

    cfg = CompareConfig(kinds=["qformer", "mlp"], scopes=["image", "note"], note_budget=32)
    assert cfg.budget_of("image") == (16, "image") and cfg.budget_of("note") == (32, "note")
    fusion = stage_configs(cfg, "qformer", "data", scope="note")[0].model.fusion
    assert (fusion.budget, fusion.budget_per, fusion.scope) == (32, "note", "note")
    pre, _, _ = stage_configs(cfg, "qformer", "data", scope="image")
    assert (pre.model.fusion.budget, pre.model.fusion.budget_per) == (16, "image")
    assert variant_folder("qformer", "note", "own", 1, 32) == "qformer-note32-own-s1"
    assert variant_folder("qformer", "image", "all", 0, 32) == "qformer"
    with pytest.raises(ValueError, match="note_budget=8 needs"):
        CompareConfig(scopes=["image"], note_budget=8)


@pytest.mark.slow
def test_two_processes_compare_as_one(tmp_path):
    from tests.helpers.launch import launch, same_weights

    world = make_world(tmp_path / "notes", notes=32)
    eps = ["--set", "pretrain.optim.eps=1e-6", "sft.optim.eps=1e-6"]  # as tests.helpers.launch.EPS
    args = ["compare-fusion", "--config", str(_config(tmp_path / "c.yaml")), "--data", str(world), *eps]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*args, "--out", str(one)]) == 0
    proc = launch(tmp_path, "torchrun", *args, "--out", str(two), module="mm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("| qformer |") == 1  # rank 0 prints the table, rank 1 nothing
    rows = [json.loads((run / "compare.json").read_text()) for run in (one, two)]
    for a, b in zip(*rows, strict=True):  # every score, size and count, timings aside
        assert b.keys() == a.keys()
        for k in (k for k in a if not k.endswith("_seconds")):
            same = b[k] == pytest.approx(a[k], rel=1e-5) if isinstance(a[k], float) else b[k] == a[k]
            assert same, (a["kind"], k, a[k], b[k])
    same_weights(one, two, [f"{r['kind']}/sft/model/model.safetensors" for r in rows[0]])
