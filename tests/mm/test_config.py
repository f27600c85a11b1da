from dataclasses import dataclass, field

import pytest

from mm.config import ConfigError, load_config


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
