"""Field docs of config dataclasses, read from their source, and a config flattened with them.

    field_docs(TrainConfig)            # {"model": "The NoteVLM ...", "init": ..., ...}
    for key, value, doc in described(cfg): ...   # ("train.steps", 300, "Optimizer steps."), ...

A field's doc is its PEP 257 attribute docstring: the string literal on the line after the field, as
every config class here writes them. They are read with :mod:`ast` from the class source (base
dataclasses too), so they never have to be repeated in ``help=`` strings or YAML comments.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any


@functools.cache
def _own_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings written in ``cls``'s own body (not its bases)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source: built in, or typed at a prompt
        return {}
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.ClassDef):
        return {}
    docs: dict[str, str] = {}
    body = node.body
    for stmt, after in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """``{field name: doc}`` of dataclass ``cls``, inherited fields included; a field without a doc is
    absent."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            docs.update(_own_docs(base))
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in docs.items() if k in names}


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass a field annotation holds (``X``, ``X | None``, ``Optional[X]``), else None."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


def config_classes(cls: type) -> list[type]:
    """``cls`` and every dataclass reachable through its fields' types, each once, ``cls`` first."""
    seen: list[type] = []

    def walk(c: type) -> None:
        if c in seen:
            return
        seen.append(c)
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            inner = _dataclass_in(hints.get(f.name))
            if inner is not None:
                walk(inner)

    walk(cls)
    return seen


def undocumented(cls: type) -> list[str]:
    """Fields of dataclass ``cls`` (its own and inherited) that have no attribute docstring."""
    docs = field_docs(cls)
    return [f.name for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()]


def described(cfg: Any, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """``(dotted key, value, doc)`` of every leaf field of config instance ``cfg``, in field order;
    nested dataclass values are walked (their own key is not a leaf)."""
    docs = field_docs(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from described(value, f"{key}.")
        else:
            yield key, value, docs.get(f.name, "")
