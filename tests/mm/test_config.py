from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from mm.config import ConfigError, from_dict, load_config


@dataclass
class Inner:
    lr: float = 1e-3
    steps: int = 10


@dataclass
class Outer:
    name: str = "x"
    train: Inner = field(default_factory=Inner)


def test_loads_nested_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: y\ntrain:\n  lr: 1\n")
    cfg = load_config(Outer, p, ["train.steps=3"])
    assert cfg == Outer(name="y", train=Inner(lr=1.0, steps=3))
    assert isinstance(cfg.train.lr, float)


@pytest.mark.parametrize("text", ["nmae: y\n", "train:\n  stpes: 3\n"])
def test_unknown_key_is_an_error_naming_valid_keys(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(Outer, p)


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Outer, tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(Outer, None, ["train.steps"])


def test_float_fields_accept_yaml_1_1_exponent_strings(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 1e-4\n")
    assert load_config(Outer, p).train.lr == 1e-4
    assert load_config(Outer, None, ["train.lr=3e-3"]).train.lr == 3e-3
    with pytest.raises(ConfigError, match="expected a number"):
        load_config(Outer, None, ["train.lr=fast"])


# ---- every field type is checked when the config is loaded -------------------------------------
@dataclass
class Typed:
    n: int = 1
    x: float = 0.5
    flag: bool = False
    name: str = "a"
    where: Path = Path(".")
    kind: Literal["clip", "siglip"] = "clip"
    tags: list[str] = field(default_factory=list)
    sizes: tuple[int, ...] = (1,)
    pair: tuple[float, float] = (0.0, 1.0)
    extra: dict[str, int] = field(default_factory=dict)
    free: dict = field(default_factory=dict)
    limit: int | None = None
    inner: Inner = field(default_factory=Inner)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("n=3", {"n": 3}),
        ("n=3.0", {"n": 3}),  # an integral float is the integer it equals (documented)
        ("n=1e4", {"n": 10000}),
        ("n=1.0e+4", {"n": 10000}),
        ("x=2", {"x": 2.0}),
        ("x=1e-4", {"x": 1e-4}),
        ("flag=true", {"flag": True}),
        ("name='2024'", {"name": "2024"}),
        ("where=runs/a", {"where": Path("runs/a")}),
        ("kind=siglip", {"kind": "siglip"}),
        ("tags=[a, b]", {"tags": ["a", "b"]}),
        ("sizes=[2, 3]", {"sizes": (2, 3)}),
        ("pair=[1, 2]", {"pair": (1.0, 2.0)}),
        ("extra={a: 1}", {"extra": {"a": 1}}),
        ("free={a: [1, x]}", {"free": {"a": [1, "x"]}}),
        ("limit=null", {"limit": None}),
        ("limit=4", {"limit": 4}),
        ("inner.steps=7", {"inner": Inner(steps=7)}),
    ],
)
def test_good_values_load_with_their_types(override, expected):
    cfg = load_config(Typed, None, [override])
    for k, v in expected.items():
        got = getattr(cfg, k)
        assert got == v and type(got) is type(v), (k, got)


@pytest.mark.parametrize(
    "override, message",
    [
        ("n=2.5", r"^n: expected an integer, got 2\.5 \(float\)$"),
        ("n=abc", r"^n: expected an integer, got 'abc' \(str\)$"),
        ("n=2.5e-1", r"^n: expected an integer, got 0\.25 \(float\)$"),
        ("n=true", r"^n: expected an integer, got True \(bool\)$"),
        ("n=[1]", r"^n: expected an integer"),
        ("x=fast", r"^x: expected a number, got 'fast' \(str\)$"),
        ("x=true", r"^x: expected a number, got True \(bool\)$"),
        ("flag=1", r"^flag: expected true or false, got 1 \(int\)$"),
        ("flag='yes'", r"^flag: expected true or false, got 'yes' \(str\)$"),
        ("name=2024", r"^name: expected a string, got 2024 \(int\); quote it"),
        ("where=3", r"^where: expected a path"),
        ("kind=triplet", r"^kind: expected one of 'clip', 'siglip'; got 'triplet'$"),
        ("tags=a", r"^tags: expected a list \(list\[str\]\), got 'a' \(str\)$"),
        ("tags=[a, 2]", r"^tags\[1\]: expected a string, got 2 \(int\)"),
        ("sizes=[1, 2.5]", r"^sizes\[1\]: expected an integer, got 2\.5"),
        ("pair=[1, 2, 3]", r"^pair: expected 2 items \(tuple\[float, float\]\), got 3"),
        ("extra=[1]", r"^extra: expected a mapping"),
        ("extra={a: b}", r"^extra\.a: expected an integer, got 'b'"),
        ("limit=2.5", r"^limit: expected an integer, got 2\.5 \(float\) or null$"),
        ("inner=3", r"^inner: expected a mapping of Inner fields, got 3 \(int\)$"),
        ("inner.steps=x", r"^inner\.steps: expected an integer, got 'x'"),
    ],
)
def test_wrong_types_are_one_clear_error(override, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config(Typed, None, [override])
    assert "\n" not in str(e.value)


def test_wrong_type_in_a_file_names_the_dotted_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  steps: 2.5\n")
    with pytest.raises(ConfigError, match=r"^train\.steps: expected an integer, got 2\.5"):
        load_config(Outer, p)


def test_type_is_checked_before_post_init_comparisons():
    @dataclass
    class Checked:
        steps: int = 1

        def __post_init__(self):
            if self.steps < 1:
                raise ValueError("steps must be >= 1")

    with pytest.raises(ConfigError, match=r"^steps: expected an integer, got 'abc'"):
        load_config(Checked, None, ["steps=abc"])
    with pytest.raises(ConfigError, match="steps must be >= 1"):
        load_config(Checked, None, ["steps=0"])


def test_missing_required_key_is_named():
    @dataclass
    class Needs:
        config: str
        n: int = 1

    with pytest.raises(ConfigError, match=r"missing required key\(s\) \['config'\]"):
        from_dict(Needs, {"n": 2})


def test_a_partial_section_keeps_the_required_keys_of_its_default_instance():
    @dataclass
    class Needs:
        config: str
        n: int = 1
        extra: list = field(default_factory=list)

    @dataclass
    class Holder:
        sft: Needs = field(default_factory=lambda: Needs(config="sft.yaml", n=5))
        bare: Needs | None = None

    got = load_config(Holder, None, ["sft.extra=[a]"])
    assert got.sft == Needs(config="sft.yaml", n=1, extra=["a"])  # n: the class default, as before
    assert load_config(Holder, None, ["sft.config=x.yaml"]).sft.config == "x.yaml"
    with pytest.raises(ConfigError, match=r"bare: missing required key\(s\) \['config'\]"):
        load_config(Holder, None, ["bare.n=2"])  # no default instance to take it from


# ---- override syntax ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, message",
    [
        ("train.steps", r"no '='.*train\.steps=VALUE; valid keys in train \(Inner\) are \['lr', 'steps'\]"),
        (
            "trian.steps=3",
            r"unknown key 'trian'; valid keys in the top level \(Outer\) are \['name', 'train'\]",
        ),
        ("train.stpes=3", r"unknown key 'train\.stpes'; valid keys in train \(Inner\) are \['lr', 'steps'\]"),
        ("train.steps.x=3", r"train\.steps is a int value, not a section"),
        ("name.x=3", r"name is a str value, not a section"),
        ("train..steps=3", r"empty key part"),
        ("=3", r"empty key part"),
        ("train.steps=[1,", r"the value is not valid YAML"),
    ],
)
def test_bad_override_names_the_key_and_the_valid_keys(override, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config(Outer, None, [override])
    assert str(e.value).startswith(f"override {override!r}")


def test_bad_yaml_and_non_utf8_files_name_file_and_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: y\ntrain: [1,\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: not valid YAML"):
        load_config(Outer, p)
    p.write_bytes(b"name: y\ntrain:\n  lr: 1 # \xe9\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:3: not UTF-8 text"):
        load_config(Outer, p)
    p.write_bytes("\ufeffname: z\n".encode())  # a UTF-8 BOM is fine
    assert load_config(Outer, p).name == "z"
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(Outer, tmp_path)


# ---- every training command: a bad value is one line, exit 2, and nothing written --------------
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["mm", "train", "--config", "configs/mm/sft_tiny.yaml", "--set", "train.steps=2.5"], "train.steps"),
        (
            ["mm", "pretrain", "--config", "tests/configs/pretrain_test.yaml", "--set", "train.steps=abc"],
            "train.steps",
        ),
        (["rl", "dpo", "--config", "configs/rl/dpo_tiny.yaml", "--set", "train.steps=true"], "train.steps"),
        (["rl", "grpo", "--config", "configs/rl/grpo_tiny.yaml", "--set", "optim.lr=fast"], "optim.lr"),
        (
            ["rl", "pipeline", "--config", "configs/rl/pipeline.yaml", "--set", "world.workers=2.5"],
            "world.workers",
        ),
        (
            [
                "rl",
                "pipeline",
                "--config",
                "configs/rl/pipeline.yaml",
                "--set",
                "dpo.overrides=[train.steps=2.5]",
            ],
            r"dpo \(configs/rl/dpo.yaml\): train.steps",
        ),
        (["mm", "train", "--config", "configs/mm/sft_tiny.yaml", "--set", "train.steps"], "no '='"),
        (["rl", "dpo", "--config", "configs/rl/dpo_tiny.yaml", "--set", "trian.steps=3"], "valid keys"),
    ],
)
def test_cli_bad_config_value_exits_2_and_writes_nothing(tmp_path, capsys, monkeypatch, argv, message):
    import re

    from mm.cli import main as mm_main
    from rl.cli import main as rl_main

    monkeypatch.chdir(ROOT)  # the configs' relative paths
    out = tmp_path / "out"
    main = mm_main if argv[0] == "mm" else rl_main
    assert main([*argv[1:], "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{argv[0]} {argv[1]}: error: "), err
    assert re.search(message, err[0]), err[0]
    assert not out.exists()
