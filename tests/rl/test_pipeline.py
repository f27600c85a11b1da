"""`rl pipeline`: a tiny end-to-end run (run folder, report, metrics keys, plots), resume skipping finished
stages, --redo, config errors (nothing half-written)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml

from rl.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY_VISION = {"kind": "open_clip", "image_size": 32, "patch_size": 8, "width": 32, "layers": 1, "heads": 2}
TINY_TEXT = {
    "model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}  # fmt: skip
POST = [p for p in ("dpo", "grpo") if importlib.util.find_spec(f"rl.trainers.{p}") is not None]


def _write(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def tiny_pipeline(tmp: Path, **top) -> Path:
    """A pipeline YAML whose stages each take a couple of steps on a 48-note world of 32 px images."""
    train = {
        "model": {"vision": TINY_VISION, "fusion": {"kind": "mlp", "budget": 4}, "text": TINY_TEXT,
                  "max_length": 200},
        "tasks": {"kinds": ["caption", "question"], "questions_per_note": 1},
        "optim": {"lr": 0.003, "warmup_steps": 1},
        "train": {"stage": "sft", "steps": 2, "batch_size": 4, "log_every": 1, "eval_every": 2,
                  "checkpoint_every": 2},
        "eval": {"notes": 2, "questions": 2, "batch_size": 2, "max_new_tokens": 6},
    }  # fmt: skip
    align = {**train, "train": {**train["train"], "stage": "align"}, "tasks": {"kinds": ["caption"]}}
    cfg = {
        "world": {
            "config": str(ROOT / "configs/mm/world_default.yaml"),
            "overrides": ["notes=48", "image_size=32", "test_fraction=0.2", "questions_per_note=2"],
            "workers": 1,
        },
        "pretrain": {
            "config": str(ROOT / "tests/configs/pretrain_test.yaml"),
            "overrides": ["model.vision.image_size=32", "train.checkpoint_every=2"],
        },
        "align": {"config": _write(tmp / "align.yaml", align)},
        "sft": {"config": _write(tmp / "sft.yaml", train)},
        "eval": {"notes": 3, "batch_size": 4, "max_new_tokens": 6},
        "post": POST,
        "threads": 1,  # 2 OpenMP threads on a loaded 2-core machine are ~100x slower than 1
    }
    step = ["train.steps=2", "train.checkpoint_every=2", "train.device=cpu"]
    if "dpo" in POST:
        cfg["dpo"] = {
            "config": str(ROOT / "configs/rl/dpo_tiny.yaml"),
            "overrides": [*step, "data.batch_size=2", "data.notes=8"],
        }
    if "grpo" in POST:
        small = [
            "rollout.group_size=2",
            "rollout.max_new_tokens=6",
            "data.prompts_per_step=2",
            "data.notes=8",
        ]
        cfg["grpo"] = {"config": str(ROOT / "configs/rl/grpo_tiny.yaml"), "overrides": [*step, *small]}
    cfg.update(top)
    return Path(_write(tmp / "pipeline.yaml", cfg))


def _run(cfg: Path, out: Path, *extra: str) -> int:
    return main(["pipeline", "--config", str(cfg), "--out", str(out), "--no-progress", *extra])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipe")
    cfg = tiny_pipeline(tmp)
    out = tmp / "run"
    assert _run(cfg, out) == 0
    return cfg, out


@pytest.mark.slow
def test_run_folder_report_and_metrics(run_dir):
    _, out = run_dir
    stages = ["data", "pretrain", "align", "sft", "eval_sft"] + [s for p in POST for s in (p, f"eval_{p}")]
    for s in stages:
        rec = json.loads((out / s / "stage.json").read_text())
        assert rec["status"] == "ran" and rec["seconds"] > 0 and rec["peak_rss_mb"] > 0, s
    for s in ["pretrain", "align", "sft", *POST]:
        assert (out / s / "metrics.jsonl").is_file() and (out / s / "curves.png").stat().st_size > 1000, s
    for s in ["align", "sft", *POST]:
        assert (out / s / "model" / "config.json").is_file(), s
    m = json.loads((out / "metrics.json").read_text())
    assert set(m) >= {
        "stages",
        "retrieval",
        "models",
        "changes",
        "targets",
        "headline",
        "peak_rss_mb",
        "load_avg",
    }
    assert list(m["stages"]) == stages
    assert "text2note_R@1" in m["retrieval"]
    assert set(m["models"]) == {"sft", *POST} and set(m["changes"]) == set(POST)
    sft = m["models"]["sft"]
    keys = ["recall", "precision", "chair_i", "chair_s", "mean_length", "partner_frac"]
    keys += ["pope_adversarial_f1", "pope_adversarial_yes_ratio", "pope_popular_f1", "pope_random_f1"]
    for k in keys:
        assert k in sft, k
    ev = json.loads((out / "eval_sft" / "eval.json").read_text())
    assert sft["chair_i"] == ev["chair"]["chair_i"] and sft["recall"] == ev["chair"]["recall"]
    for p in POST:
        d = m["changes"][p]
        after = m["models"][p]
        assert d["recall_change_points"] == pytest.approx(100 * (after["recall"] - sft["recall"]))
    assert m["pipeline_seconds"] == pytest.approx(sum(s["seconds"] for s in m["stages"].values()))
    names = [t["target"] for t in m["targets"]]
    assert "SFT object recall" in names and "pipeline wall time (s)" in names
    report = (out / "report.md").read_text()
    for text in (
        "Before / after",
        "CHAIR_i",
        "POPE-adv F1",
        "yes-ratio",
        "peak memory",
        "## Stages",
        "by cause",
    ):
        assert text in report, text
    for png in ("before_after.png", "causes.png", "stage_times.png"):
        assert (out / png).stat().st_size > 5000, png
        assert f"]({png})" in report
    assert "](sft/curves.png)" in report


@pytest.mark.slow
def test_resume_skips_finished_stages_and_redo_reruns_the_tail(run_dir, capsys):
    cfg, out = run_dir
    before = (out / "sft" / "stage.json").read_text()
    capsys.readouterr()
    assert _run(cfg, out) == 0
    err = capsys.readouterr().err
    assert err.count("skipped") == len(json.loads((out / "metrics.json").read_text())["stages"])
    assert (out / "sft" / "stage.json").read_text() == before
    m = json.loads((out / "metrics.json").read_text())
    assert all(s["status"].startswith("skipped") for s in m["stages"].values())

    names = list(m["stages"])
    redo = names[-2]  # the last post-training stage: it and its evaluation run again
    assert _run(cfg, out, "--redo", redo) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert [s["status"] == "ran" for s in m["stages"].values()] == [n in names[-2:] for n in names]


def test_same_config_accepts_options_added_at_their_default():
    from rl.pipeline import same_config

    new = {"tasks": {"kinds": ["caption"], "answer_style": "word"}, "steps": 3}
    default = {"tasks": {"kinds": ["caption", "question"], "answer_style": "word"}, "steps": 300}
    assert same_config(new, new, default)
    older = {"tasks": {"kinds": ["caption"]}, "steps": 3}  # recorded before answer_style existed
    assert same_config(older, new, default)
    assert not same_config(older, new, {})  # no known default: strict
    assert not same_config(
        older, {"tasks": {"kinds": ["caption"], "answer_style": "object"}, "steps": 3}, default
    )
    assert not same_config({**new, "steps": 4}, new, default)
    assert not same_config({**new, "gone": 1}, new, default)  # an option that no longer exists


@pytest.mark.slow
def test_stage_recorded_before_a_new_option_is_still_skipped(run_dir, capsys):
    cfg, out = run_dir
    marker = out / "sft" / "stage.json"
    rec = json.loads(marker.read_text())
    before = marker.read_text()
    del rec["config"]["tasks"]["answer_style"]  # as an older notelens wrote it
    marker.write_text(json.dumps(rec))
    try:
        capsys.readouterr()
        assert _run(cfg, out) == 0
        m = json.loads((out / "metrics.json").read_text())
        assert all(s["status"].startswith("skipped") for s in m["stages"].values())
    finally:
        marker.write_text(before)


@pytest.mark.slow
def test_resume_with_out_spelt_differently_or_moved(run_dir, tmp_path, monkeypatch, capsys):
    cfg, out = run_dir  # the run was made with an absolute --out
    monkeypatch.chdir(out.parent)
    n = len(json.loads((out / "metrics.json").read_text())["stages"])
    for spelling in ("run", "./run/", f"../{out.parent.name}/run"):
        capsys.readouterr()
        assert main(["pipeline", "--config", str(cfg), "--out", spelling, "--no-progress"]) == 0, spelling
        assert capsys.readouterr().err.count("skipped") == n, spelling
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)  # stage.json records where it ran: a moved run folder resumes too
    capsys.readouterr()
    assert _run(cfg, moved) == 0
    assert capsys.readouterr().err.count("skipped") == n


@pytest.mark.slow
def test_changed_stage_config_is_refused(run_dir, capsys):
    cfg, out = run_dir
    assert _run(cfg, out, "--set", "eval.notes=2") == 2
    err = capsys.readouterr().err
    assert "eval_sft" in err and "--redo" in err and "different config" in err


def test_config_errors_exit_2_before_writing(tmp_path, capsys):
    cfg = tiny_pipeline(tmp_path)
    out = tmp_path / "run"
    assert _run(cfg, out, "--set", "evall.notes=3") == 2
    assert "unknown key" in capsys.readouterr().err
    assert _run(cfg, out, "--set", "post=[ppo]") == 2
    assert "post must list" in capsys.readouterr().err
    assert _run(cfg, out, "--set", "sft.config=nowhere.yaml") == 2
    assert "nowhere.yaml" in capsys.readouterr().err
    assert _run(cfg, out, "--set", "align.overrides=[train.stepz=3]") == 2
    assert "stepz" in capsys.readouterr().err
    assert _run(cfg, out, "--set", "sft.overrides=[train.stage=align]") == 2
    assert "train.stage" in capsys.readouterr().err
    assert _run(cfg, out, "--redo", "nope") == 2
    assert "not a stage" in capsys.readouterr().err
    assert not out.exists()


def test_shipped_config_resolves(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # stage config paths are relative to the working directory
    from mm.config import load_config
    from rl.pipeline import PipelineConfig, resolve

    cfg = load_config(PipelineConfig, ROOT / "configs/rl/pipeline.yaml")
    cfg.post = [p for p in cfg.post if p in POST]
    configs = resolve(cfg, tmp_path / "demo")
    assert configs["sft"].init.model == str(tmp_path / "demo" / "align" / "model")
    assert configs["pretrain"].data.folder == str(tmp_path / "demo" / "data" / "world")
