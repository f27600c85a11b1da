"""Typed configs: dataclasses loaded from YAML, where an unknown key or a wrong type is an error.

    cfg = load_config(PretrainConfig, "configs/mm/pretrain_tiny.yaml", ["train.steps=50"])

Nested dataclass fields are filled from nested mappings. ``overrides`` are ``dotted.key=value``
strings parsed as YAML scalars, applied after the file. A misspelt key fails with the list of
valid keys, never a silent default (nanoGPT's configurator does the same).

Every value is checked against its field's annotation when the config is loaded, before a caller
writes anything:

- ``int``: an integer; ``True``/``False`` and non-integral numbers (``2.5``) are rejected, an
  integral float (``3.0``, ``1e4``) is accepted as the integer it equals.
- ``float``: a number (an int becomes a float) or a float literal string such as ``1e-4``
  (PyYAML reads YAML 1.1, where ``1e-4`` is a string); booleans are rejected.
- ``bool``: ``true`` or ``false`` only (not ``1``, ``"yes"``).
- ``str``: a string (quote a value YAML would read as a number: ``name: "2024"``).
- ``pathlib.Path``: a string, converted to a ``Path``.
- ``Literal[...]``: one of the listed values; the error lists them.
- ``list[T]`` / ``tuple[T, ...]`` / ``tuple[A, B]``: a YAML list, each element checked (and the
  length, for a fixed-length tuple); ``dict[K, V]``: a mapping, keys and values checked.
- ``X | None``: ``null`` or an ``X``; a nested dataclass: a mapping checked field by field.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
"""A number in exponent form, which PyYAML (YAML 1.1) reads as a string unless it has ``.`` and a sign."""


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


def _type_name(tp: Any) -> str:
    """``int``, ``list[str]``, ``'a' | 'b'``, ``float | None`` for messages."""
    if tp is type(None):
        return "null"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(tp, "__name__", str(tp))


def _got(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_value(tp: Any, value: Any, key: str) -> Any:
    """``value`` checked against annotation ``tp`` (and converted where the module docstring says)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return check_value(arm, value, key)
            except ConfigError as e:
                errors.append(str(e))
        if len(errors) == 1:
            raise ConfigError(errors[0] + (" or null" if type(None) in args else ""))
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {_got(value)}")
    if origin is typing.Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise ConfigError(f"{key}: expected one of {', '.join(repr(a) for a in args)}; got {value!r}")
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {_got(value)}")
        return from_dict(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {_got(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
            value = float(value)  # ``1e4``: a string to PyYAML (YAML 1.1)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {_got(value)}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            # PyYAML (YAML 1.1) reads ``1e-4`` as a string; accept any float literal for float fields.
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {_got(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        hint = f'; quote it in YAML: "{value}"' if isinstance(value, int | float) else ""  # bools too
        raise ConfigError(f"{key}: expected a string, got {_got(value)}{hint}")
    if tp is Path or (isinstance(tp, type) and issubclass(tp, Path)):
        if isinstance(value, str | Path):
            return Path(value)
        raise ConfigError(f"{key}: expected a path (string), got {_got(value)}")
    if tp in (list, tuple) or origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list ({_type_name(tp)}), got {_got(value)}")
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise ConfigError(
                    f"{key}: expected {len(args)} items ({_type_name(tp)}), got {len(value)}: {list(value)!r}"
                )
            items = [check_value(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value))]
        else:
            elem = args[0] if args else Any
            items = [check_value(elem, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (tp is tuple or origin is tuple) else items
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping ({_type_name(tp)}), got {_got(value)}")
        kt, vt = args if args else (Any, Any)
        return {check_value(kt, k, f"{key} key"): check_value(vt, v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {_got(value)}")
    return value  # an annotation this loader does not know (e.g. a TypeVar): passed through


def _with_factory_required(f: dataclasses.Field, value: dict[str, Any]) -> dict[str, Any]:
    """A nested section's mapping with the required keys it lacks taken from the field's default instance
    (``field(default_factory=lambda: StageSpec(config="x.yaml"))``): ``--set sft.overrides=[...]`` on a file
    without an ``sft`` section then keeps the default ``sft.config``. Keys with a class default are left to
    it, so nothing else changes."""
    if f.default_factory is dataclasses.MISSING:
        return value
    default = f.default_factory()
    if not dataclasses.is_dataclass(default):
        return value
    required = [
        g.name for g in dataclasses.fields(default)
        if g.init and g.default is dataclasses.MISSING and g.default_factory is dataclasses.MISSING
    ]  # fmt: skip
    return {**{k: getattr(default, k) for k in required if k not in value}, **value}


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise :class:`ConfigError`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        raise ConfigError(
            f"{where or cls.__name__}: unknown key(s) {unknown}; "
            f"valid keys for {cls.__name__} are {sorted(fields)}"
        )
    required = [
        n for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and n not in data
    ]  # fmt: skip
    if required:
        raise ConfigError(f"{where or cls.__name__}: missing required key(s) {required}")
    kwargs = {}
    for name, value in data.items():
        if isinstance(value, dict) and _is_dataclass_type(hints[name]):
            value = _with_factory_required(fields[name], value)
        kwargs[name] = check_value(hints[name], value, f"{where}.{name}" if where else name)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain Python data (for run logs and checkpoints)."""
    return dataclasses.asdict(cfg)


def _check_override_key(cls: type, parts: list[str], override: str) -> None:
    """Each part of a dotted override key must name a field, every part but the last a section."""
    tp: Any = cls
    for depth, p in enumerate(parts):
        here = ".".join(parts[: depth + 1])
        if not _is_dataclass_type(tp):
            if tp is dict or typing.get_origin(tp) is dict or tp is Any:
                return  # free-form mapping: any sub-key
            raise ConfigError(
                f"override {override!r}: {'.'.join(parts[:depth])} is a {_type_name(tp)} value, not a section"
            )
        fields = {f.name for f in dataclasses.fields(tp) if f.init}
        if p not in fields:
            section = ".".join(parts[:depth]) or "the top level"
            raise ConfigError(
                f"override {override!r}: unknown key {here!r}; valid keys in {section} ({tp.__name__}) are "
                f"{sorted(fields)}"
            )
        tp = _strip_optional(typing.get_type_hints(tp)[p])


def _section_keys(cls: type, parts: list[str]) -> str:
    """ "valid keys in SECTION (Class) are [...]" for the section ``parts`` names, if it is one."""
    tp: Any = cls
    for p in parts:
        fields = {f.name: f for f in dataclasses.fields(tp) if f.init} if _is_dataclass_type(tp) else {}
        if p not in fields:
            return ""
        tp = _strip_optional(typing.get_type_hints(tp)[p])
    if not _is_dataclass_type(tp):
        return ""
    names = sorted(f.name for f in dataclasses.fields(tp) if f.init)
    return f"valid keys in {'.'.join(parts) or 'the top level'} ({tp.__name__}) are {names}"


def _apply_override(data: dict[str, Any], override: str, cls: type | None = None) -> None:
    if "=" not in override:
        keys = _section_keys(cls, override.strip().split(".")[:-1]) if cls is not None else ""
        raise ConfigError(
            f"override {override!r}: no '='; an override looks like key.sub=value, "
            f"e.g. {override.strip()}=VALUE" + (f"; {keys}" if keys else "")
        )
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    if not all(p.strip() for p in parts):
        raise ConfigError(f"override {override!r}: empty key part in {key!r}; write key.sub=value")
    parts = [p.strip() for p in parts]
    if cls is not None:
        _check_override_key(cls, parts, override)
    node = data
    for depth, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(
                f"override {override!r}: {'.'.join(parts[: depth + 1])} is a value, not a section"
            )
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ConfigError(
            f"override {override!r}: the value is not valid YAML ({_yaml_problem(e)})"
        ) from None


def _yaml_problem(e: yaml.YAMLError) -> str:
    return getattr(e, "problem", None) or str(e).splitlines()[0]


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Load ``cls`` from a YAML file (or defaults when ``path`` is None) plus overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} " + ("is a folder" if p.is_dir() else "does not exist"))
        try:
            raw = p.read_bytes()
            loaded = yaml.safe_load(raw.decode("utf-8-sig"))
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            raise ConfigError(f"{p}:{line}: not UTF-8 text ({e.reason}); save the file as UTF-8") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{p}{at}: not valid YAML ({_yaml_problem(e)})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping, got {type(loaded).__name__}")
        data = loaded or {}
    for o in overrides or []:
        _apply_override(data, o, cls)
    return from_dict(cls, data)
