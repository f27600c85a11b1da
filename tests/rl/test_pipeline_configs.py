"""The shipped main job's stage configs: configs/rl/pipeline.yaml names one YAML per stage and no recipe
overrides, and the stage configs it resolves to are the frozen recipe (tests/rl/pipeline_stages.json, the
resolved configs of the earlier layout: tiny YAMLs plus override lists). Paths in the run folder compare
resolved (resume with the same --out spelt differently)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from mm.config import load_config
from rl.pipeline import PipelineConfig, _config_dict, _defaults, in_run_folder, resolve, same_config

ROOT = Path(__file__).resolve().parents[2]
FROZEN = json.loads((Path(__file__).with_name("pipeline_stages.json")).read_text())
STAGE_FILES = {
    "world": "configs/mm/world.yaml",
    "pretrain": "configs/mm/pretrain.yaml",
    "align": "configs/mm/align.yaml",
    "sft": "configs/mm/sft.yaml",
    "dpo": "configs/rl/dpo.yaml",
    "grpo": "configs/rl/grpo.yaml",
}


@pytest.fixture(scope="module")
def shipped():
    """The shipped pipeline config and its stage configs, resolved for run folder ``OUT`` (from the repo)."""
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)  # stage config paths are relative to the working directory
    try:
        cfg = load_config(PipelineConfig, "configs/rl/pipeline.yaml")
        yield cfg, resolve(cfg, Path("OUT"))
    finally:
        mp.undo()


def test_pipeline_yaml_names_one_file_per_stage_and_no_overrides(shipped):
    cfg, _ = shipped
    for stage, path in STAGE_FILES.items():
        spec = getattr(cfg, stage)
        assert spec.config == path and spec.overrides == [], stage
    raw = yaml.safe_load((ROOT / "configs/rl/pipeline.yaml").read_text())
    assert not any("overrides" in v for v in raw.values() if isinstance(v, dict))
    assert PipelineConfig().pretrain.config == STAGE_FILES["pretrain"]  # the defaults name the same files


@pytest.mark.parametrize("stage", ["data", "pretrain", "align", "sft", "dpo", "grpo"])
def test_resolved_stage_config_is_the_frozen_recipe(shipped, stage):
    _, configs = shipped
    got = _config_dict(configs[stage])
    want = FROZEN[stage]
    # an option added later at its default keeps the recipe (the pipeline's own resume rule)
    assert same_config(want, got, _defaults(configs[stage])), json.dumps(
        {k: (want.get(k), got.get(k)) for k in got if want.get(k) != got.get(k)}, indent=1
    )


def test_recipe_spot_values(shipped):
    """A few recipe values spelt out, so a broken freeze cannot hide a changed recipe."""
    cfg, c = shipped
    assert c["data"].notes == 12000 and cfg.world.workers == 2
    assert (c["pretrain"].train.steps, c["pretrain"].train.batch_size, c["pretrain"].loss.tag_weight) == (
        4000, 24, 1.0,
    )  # fmt: skip
    assert c["pretrain"].data.folder == "OUT/data/world" and c["pretrain"].data.eval_notes == 300
    align = c["align"]
    assert (align.train.steps, align.optim.lr, align.init.pretrain) == (20, 1e-4, "OUT/pretrain")
    assert c["sft"].tasks.kinds == ["caption", "question", "pope_question"]
    assert (c["sft"].train.steps, c["sft"].tasks.question_weight, c["sft"].init.model) == (
        3000, 17.5, "OUT/align/model",
    )  # fmt: skip
    assert (c["dpo"].data.build, c["dpo"].data.notes, c["dpo"].loss.sft_weight) == ("onpolicy", 600, 1.0)
    assert (c["grpo"].train.steps, c["grpo"].reward.hallucination_weight, c["grpo"].algo.mention_credit) == (
        80, 3.5, 3.0,
    )  # fmt: skip
    assert _config_dict(cfg.eval) == FROZEN["eval"]
    assert (cfg.post, cfg.threads) == (FROZEN["pipeline"]["post"], FROZEN["pipeline"]["threads"])


YAMLS = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("configs/**/*.yaml"))


@pytest.mark.parametrize("path", YAMLS)
def test_yaml_comments_say_what_not_history(path):
    text = (ROOT / path).read_text().lower()
    for pattern in (r"session", r"issue \d", r"runs/p\d", r"/work/", r"/tmp/", r"\(readme"):
        assert not re.search(pattern, text), (path, pattern)


def test_in_run_folder_resolves_spellings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conf = {"data": {"folder": "runs/x/data/world", "split": "train"}, "init": {"model": "runs/x/sft/model"}}
    want = {"data": {"folder": "$OUT/data/world", "split": "train"}, "init": {"model": "$OUT/sft/model"}}
    for out in ("runs/x", "./runs/x", "runs/x/", str(tmp_path / "runs" / "x"), "runs/y/../x"):
        assert in_run_folder(conf, Path(out)) == want, out
    folder = str(tmp_path / "runs/x/data/world")
    absolute = {"data": {"folder": folder, "split": "train"}, "init": {"model": None}}
    assert in_run_folder(absolute, Path("runs/x/")) == {
        "data": {"folder": "$OUT/data/world", "split": "train"}, "init": {"model": None},
    }  # fmt: skip
    # a path outside the run folder, and a prompt, stay as they are
    other = {"pairs": "runs/other/pairs.jsonl", "prompt": "Describe the note.", "n": 3, "kinds": ["a/b"]}
    assert in_run_folder(other, Path("runs/x")) == other
    assert in_run_folder({"folder": "runs/x"}, Path("runs/x")) == {"folder": "$OUT"}
