"""Config kinds, field docs and ``mm config show``: every shipped YAML maps to its dataclass, the output
names every field with its doc, every config field has a doc, and every ``--set`` takes the same syntax."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mm.cli import main
from mm.config import ConfigError, load_config
from mm.config_docs import config_classes, described, field_docs, undocumented
from mm.config_kinds import KINDS, all_classes, config_class, guess_kind

ROOT = Path(__file__).resolve().parents[1]
YAMLS = sorted(
    p.relative_to(ROOT).as_posix()
    for p in ROOT.glob("configs/**/*.yaml")
    if p.parent.name != "accelerate"  # accelerate launch's own files, not a project config kind
)
EXPECTED_KIND = {
    "mm/align": "train", "mm/align_tiny": "train", "mm/sft": "train", "mm/sft_tiny": "train",
    "mm/sft_lora_tiny": "train", "mm/pretrain": "pretrain", "mm/pretrain_tiny": "pretrain",
    "mm/compare_tiny": "compare", "mm/compare_multi_image": "compare", "mm/world": "world",
    "mm/world_default": "world",
    "mm/notevlm_tiny": "notevlm", "mm/notevlm_small": "notevlm", "rl/dpo": "dpo", "rl/dpo_tiny": "dpo",
    "rl/grpo": "grpo", "rl/grpo_tiny": "grpo", "rl/grpo_files": "grpo_files", "rl/pipeline": "pipeline",
    "rl/grpo_entropy": "grpo",
    "rl/distill": "distill", "rl/distill_tiny": "distill",
    "rl/dpo_nogt": "dpo", "rl/dpo_nogt_tiny": "dpo", "rl/grpo_nogt": "grpo", "rl/grpo_nogt_tiny": "grpo",
    "rl/pipeline_nogt": "pipeline",
    "mm/pretrain_colour": "pretrain", "rl/pipeline_colour": "pipeline",
    "rl/dpo_colour": "dpo", "rl/grpo_colour": "grpo",
    "rl/ppo": "ppo", "rl/ppo_tiny": "ppo",
    "recipes/align": "train", "recipes/sft_lora": "train", "recipes/dpo_files": "dpo_files",
    "rl/agent": "agent", "rl/agent_tiny": "agent", "rl/agent_world": "agent", "rl/agent_files": "agent",
    "rl/agent_world_fast": "agent",
}  # fmt: skip


def _norm(text: str) -> str:
    return " ".join(text.split())


def _show(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["config", "show", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("path", YAMLS)
def test_every_shipped_yaml_has_a_known_kind_and_loads(path):
    import yaml

    kind, how = guess_kind(path, yaml.safe_load((ROOT / path).read_text()))
    assert kind == EXPECTED_KIND[path.removeprefix("configs/").removesuffix(".yaml")], (path, kind)
    assert "file name" in how, how
    assert dataclasses.is_dataclass(load_config(config_class(kind), ROOT / path))


def test_show_prints_every_field_with_its_doc(capsys):
    rc, out, _ = _show(capsys, str(ROOT / "configs/mm/sft.yaml"), "--set", "train.steps=7", "optim.lr=0.5")
    assert rc == 0
    head, *lines = out.splitlines()
    assert "mm.train.sft.config.TrainConfig" in head and "kind train (guessed from the file name" in head
    cfg = load_config(config_class("train"), ROOT / "configs/mm/sft.yaml", ["train.steps=7", "optim.lr=0.5"])
    keys = [line.split(":")[0] for line in lines if line and not line.startswith((" ", "#"))]
    assert keys == [k for k, _, _ in described(cfg)]  # every leaf field, in order, nothing else
    flat = _norm(out)
    for key, _, doc in described(cfg):
        assert doc and _norm(doc) in flat, key
    assert "train.steps: 7\n" in out and "optim.lr: 0.5\n" in out  # overrides applied
    assert "tasks.kinds: [caption, question, pope_question]\n" in out  # YAML spelling, as --set takes it
    assert "    Optimizer steps.\n" in out  # the doc sits indented under its field


def test_show_pipeline_and_world_docs(capsys):
    from mm.world.config import WorldConfig
    from rl.pipeline import PipelineConfig

    for path, cls in (("configs/rl/pipeline.yaml", PipelineConfig), ("configs/mm/world.yaml", WorldConfig)):
        rc, out, _ = _show(capsys, str(ROOT / path))
        assert rc == 0 and f"{cls.__module__}.{cls.__qualname__}" in out
        for key, _, doc in described(load_config(cls, ROOT / path)):
            assert f"\n{key}: " in out and _norm(doc) in _norm(out), key
    rc, out, _ = _show(capsys, "--kind", "world")  # no file: the defaults
    assert rc == 0 and "# defaults: mm.world.config.WorldConfig" in out and "\nnotes: 2000\n" in out


def test_kind_from_keys_alias_and_given_kind(tmp_path, capsys):
    cfg = tmp_path / "config.yaml"  # a run folder's config: no kind in its name
    cfg.write_text("init: {model: m}\ntrain: {steps: 3}\nrollout: {group_size: 2}\n")  # init: only grpo's
    rc, out, _ = _show(capsys, str(cfg))
    assert rc == 0 and "kind grpo (guessed from the top-level keys" in out and "train.steps: 3\n" in out
    rc, out, _ = _show(capsys, str(cfg), "--kind", "grpo")
    assert rc == 0 and "given with --kind" in out
    rc, out, _ = _show(capsys, str(ROOT / "configs/mm/align.yaml"), "--kind", "align")  # an alias
    assert rc == 0 and "mm.train.sft.config.TrainConfig" in out and "train.stage: align\n" in out


def test_errors_are_one_line_with_exit_2(tmp_path, capsys):
    rc, out, err = _show(capsys, str(ROOT / "configs/mm/sft.yaml"), "--kind", "nope")
    assert rc == 2 and out == "" and "unknown config kind 'nope'" in err
    assert all(k in err for k in KINDS)  # lists the known kinds
    both = tmp_path / "x.yaml"
    both.write_text("train: {steps: 3}\noptim: {lr: 0.1}\n")  # fits pretrain, train, dpo, grpo
    rc, _, err = _show(capsys, str(both))
    assert rc == 2 and "cannot tell the kind" in err and "--kind" in err and "pretrain" in err
    rc, _, err = _show(capsys, str(ROOT / "configs/mm/sft.yaml"), "--set", "train.stepz=3")
    assert rc == 2 and "stepz" in err and "unknown key" in err
    rc, _, err = _show(capsys, str(tmp_path / "missing.yaml"))
    assert rc == 2 and "does not exist" in err
    rc, _, err = _show(capsys)
    assert rc == 2 and "--kind" in err
    with pytest.raises(ConfigError, match="unknown config kind"):
        config_class("sac")


def test_kinds_lists_each_kind_and_its_command(capsys):
    assert main(["config", "kinds"]) == 0
    out = capsys.readouterr().out
    for name, kind in KINDS.items():
        assert name in out and kind.command in out


def test_field_docs_read_pep257_attribute_docstrings():
    @dataclasses.dataclass
    class Base:
        a: int = 1
        """The a.

        Second paragraph."""
        b: int = 2  # a comment is not a doc

    @dataclasses.dataclass
    class Child(Base):
        c: str = "x"
        """The c."""

    assert field_docs(Child) == {"a": "The a.\n\nSecond paragraph.", "c": "The c."}
    assert undocumented(Child) == ["b"]


def _classes() -> list[type]:
    seen: list[type] = []
    for top in all_classes():
        seen += [c for c in config_classes(top) if c not in seen]
    return seen


@pytest.mark.parametrize(
    "cls",
    _classes(),
    ids=lambda c: f"{c.__module__}.{c.__qualname__}",
)  # fmt: skip
def test_every_config_field_has_a_doc(cls):
    assert undocumented(cls) == [], f"{cls.__module__}.{cls.__qualname__}: fields without a docstring"


def test_the_named_classes_are_covered():
    names = {f"{c.__module__}.{c.__qualname__}" for c in _classes()}
    for want in (
        "mm.world.config.WorldConfig", "mm.fusion.FusionConfig", "mm.multi_image.MultiImageConfig",
        "mm.vision.VisionConfig", "mm.eval.pope.PopeBuildConfig", "rl.pairs.cli.PairsConfig",
        "rl.pipeline.PipelineConfig", "rl.pipeline.StageSpec", "rl.rewards.RewardConfig",
    ):  # fmt: skip
        assert want in names, want


COMMANDS_WITH_SET = [
    ("mm", ["pretrain", "--config", "c.yaml"]),
    ("mm", ["train", "--config", "c.yaml"]),
    ("mm", ["compare-fusion", "--config", "c.yaml"]),
    ("mm", ["data", "world", "--out", "o"]),
    ("mm", ["config", "show", "c.yaml"]),
    ("rl", ["dpo", "--config", "c.yaml"]),
    ("rl", ["grpo", "--config", "c.yaml"]),
    ("rl", ["pipeline"]),
]


@pytest.mark.parametrize("prog,argv", COMMANDS_WITH_SET, ids=lambda x: x if isinstance(x, str) else x[0])
def test_set_takes_several_values_and_repeats(prog, argv):
    from mm.cli import COMMANDS as MM
    from mm.dispatch import build_parser
    from rl.cli import COMMANDS as RL

    argv = [*argv, "--set", "a=1", "b.c=2", "--set", "d=[x, y]"]
    args = build_parser(prog, "", MM if prog == "mm" else RL, argv).parse_args(argv)
    got = getattr(args, "overrides", None) or getattr(args, "set", None)
    assert got == ["a=1", "b.c=2", "d=[x, y]"]
