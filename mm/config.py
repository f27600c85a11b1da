"""Typed configs: dataclasses loaded from YAML, where an unknown key is an error.

    cfg = load_config(PretrainConfig, "configs/mm/pretrain_tiny.yaml", ["train.steps=50"])

Nested dataclass fields are filled from nested mappings. ``overrides`` are ``dotted.key=value``
strings parsed as YAML scalars, applied after the file. A misspelt key fails with the list of
valid keys, never a silent default (nanoGPT's configurator does the same).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override does not match its dataclass."""


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _strip_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys raise :class:`ConfigError`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where or cls.__name__}: unknown key(s) {unknown}; "
            f"valid keys for {cls.__name__} are {sorted(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        tp = _strip_optional(hints[name])
        key = f"{where}.{name}" if where else name
        if _is_dataclass_type(tp) and isinstance(value, dict):
            value = from_dict(tp, value, key)
        elif tp is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif tp is float and isinstance(value, str):
            # PyYAML (YAML 1.1) reads ``1e-4`` as a string; accept any float literal for float fields.
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        elif tp is tuple or typing.get_origin(tp) is tuple:
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain Python data (for run logs and checkpoints)."""
    return dataclasses.asdict(cfg)


def _apply_override(data: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.sub=value")
    key, raw = override.split("=", 1)
    node = data
    parts = key.strip().split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {override!r}: {p!r} is not a section")
    node[parts[-1]] = yaml.safe_load(raw)


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Load ``cls`` from a YAML file (or defaults when ``path`` is None) plus overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        loaded = yaml.safe_load(p.read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping, got {type(loaded).__name__}")
        data = loaded or {}
    for o in overrides or []:
        _apply_override(data, o)
    return from_dict(cls, data)
