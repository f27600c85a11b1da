"""``rl pipeline`` under ``torchrun``: 2 gloo processes run the main job as one process runs it (every
trained model to 1e-5, every held-out eval identical), rank 0 alone renders the world and writes the
markers and the report, a re-run resumes, and a stage that fails on rank 0 stops both processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.launch import EPS, launch, moved, one_and_two, same_weights
from tests.rl.test_pipeline import POST, tiny_pipeline

pytestmark = pytest.mark.slow

MODELS = ["align", "sft", *POST]


def _pretrained(out: Path) -> str:
    """The pretraining's last checkpoint, relative to ``out``."""
    return sorted(p.relative_to(out).as_posix() for p in (out / "pretrain").rglob("model.safetensors"))[-1]


def _moving(cfg: Path) -> Path:
    """``cfg`` with post-training steps large enough to move the weights past the comparison's tolerance."""
    data = yaml.safe_load(cfg.read_text())
    for post in POST:
        data[post]["overrides"] += ["optim.lr=1e-3", "optim.warmup_steps=0", EPS]
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg


def test_two_processes_run_the_pipeline_as_one(tmp_path):
    cfg = _moving(tiny_pipeline(tmp_path))
    args = ["pipeline", "--config", str(cfg), "--no-progress"]
    one, two, stdout = one_and_two(tmp_path, args, fsdp=False)
    assert stdout.count('"pipeline_seconds"') == 1  # the headline: rank 0 prints, rank 1 does not
    names = [_pretrained(one), *(f"{m}/model/model.safetensors" for m in MODELS)]
    assert _pretrained(two) == names[0]
    weights = dict(zip(names, same_weights(one, two, names), strict=True))
    for post in POST:  # post-training moved the SFT model (else equal weights would prove nothing)
        moved(weights["sft/model/model.safetensors"], weights[f"{post}/model/model.safetensors"])
    for stage in ("eval_sft", *(f"eval_{p}" for p in POST)):
        a, b = (json.loads((run / stage / "eval.json").read_text()) for run in (one, two))
        for key in ("chair", "pope", "claims", "samples", "units"):
            assert b[key] == a[key], (stage, key)
    for stage in ("data", "pretrain", "align", "sft", "eval_sft"):
        a, b = (json.loads((run / stage / "stage.json").read_text()) for run in (one, two))
        assert b["config"] == json.loads(json.dumps(a["config"]).replace(str(one), str(two))), stage
    assert (one / "data/world/notes.jsonl").read_text() == (two / "data/world/notes.jsonl").read_text()
    report = json.loads((two / "metrics.json").read_text())
    assert report["headline"]["sft"] == json.loads((one / "metrics.json").read_text())["headline"]["sft"]
    assert (two / "report.md").is_file()
    # a re-run under the launch finds every stage done and says so once; --seeds 2 adds a training seed
    again = launch(two.parent, "torchrun", *args, "--out", str(two), "--seeds", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("data: done earlier") == 1 and again.stderr.count("eval_sft: done earlier") == 1
    seeds = json.loads((two / "metrics.json").read_text())["seeds"]
    assert [len(seeds[p]["runs"]) for p in POST] == [2] * len(POST)
    for post in POST:
        assert (two / "seeds" / str(seeds[post]["runs"][1]["seed"]) / f"eval_{post}/stage.json").is_file()


def test_a_stage_failing_on_rank_0_stops_both_processes(tmp_path):
    cfg = tiny_pipeline(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / "data").write_text("a file where the data stage makes its folder")
    proc = launch(tmp_path, "torchrun", "pipeline", "--config", str(cfg), "--no-progress", "--out", str(out))
    assert proc.returncode != 0
    assert "process 0 of 2 failed: FileExistsError" in proc.stderr  # rank 1 names rank 0's error
    assert not (out / "pretrain").exists()
