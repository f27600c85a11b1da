"""Reading users' JSON and JSONL files: UTF-8 (a BOM is fine), ``FILE:LINE`` errors, one id rule.

    text = read_utf8(path)                      # FILE:LINE error for bytes that are not UTF-8
    for line, obj in read_jsonl(path): ...      # one JSON object per non-blank line
    data, lines = read_json(path)               # lines.item(i), lines.member("annotations", i)
    qid = normalize_id(obj["question_id"], f"{path}:{line}")

Ids (question ids, image ids) are compared as strings: a JSON string is kept as written, an
integer or an integral float becomes its decimal digits (``2``, ``"2"`` and ``2.0`` are all ``"2"``).
``true``/``false``, ``null``, non-integral numbers, lists and objects are errors naming the file and
line. Every error is raised as the caller's exception class (a :class:`~mm.errors.UserError`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from mm.errors import UserError


def read_utf8(path: str | Path, error: type[Exception] = UserError) -> str:
    """The text of ``path``; a leading UTF-8 BOM is dropped, other non-UTF-8 bytes name the line."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{p}: " + ("is a folder, a file was expected" if p.is_dir() else "no such file"))
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise error(
            f"{p}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {column}); save it as UTF-8"
        ) from None


def read_jsonl(path: str | Path, error: type[Exception] = UserError) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line; a bad line raises ``FILE:LINE: why``."""
    out = []
    for i, line in enumerate(read_utf8(path, error).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{path}:{i}: not valid JSON ({e.msg}); expected one object per line") from None
        if not isinstance(obj, dict):
            raise error(f"{path}:{i}: expected a JSON object, got {type(obj).__name__}")
        out.append((i, obj))
    return out


class Lines:
    """Line numbers inside a JSON document, computed only when asked (for error messages)."""

    def __init__(self, text: str):
        self._text = text
        self._members: dict[str, list[tuple[int, Any, int]]] = {}

    @functools.cached_property
    def _top(self) -> list[tuple[int, Any, int]]:
        return _items(self._text, _first(self._text))

    def start(self) -> int:
        """Line of the document's first character."""
        i = _first(self._text)
        return self._text.count("\n", 0, i) + 1

    def item(self, index: int) -> int:
        """Line of item ``index`` of the top-level list, or of key ``index`` of the top-level object."""
        top = self._top
        return top[index][0] if 0 <= index < len(top) else self.start()

    def keys(self) -> list[tuple[int, str]]:
        """``(line, key)`` of every top-level key in file order, duplicates included."""
        return [(line, key) for line, key, _ in self._top if key is not None]

    def value(self, index: int) -> Any:
        """The value of top-level item/key ``index`` as written (the first one of a repeated key)."""
        return json.JSONDecoder().raw_decode(self._text, self._top[index][2])[0]

    def _member(self, key: str) -> list[tuple[int, Any, int]]:
        if key not in self._members:
            starts = [s for _, k, s in self._top if k == key and self._text[s] in "[{"]
            self._members[key] = _items(self._text, starts[0]) if starts else []
        return self._members[key]

    def member(self, key: str, index: int) -> int:
        """Line of item ``index`` of the list under top-level ``key`` (e.g. ``annotations``)."""
        items = self._member(key)
        if 0 <= index < len(items):
            return items[index][0]
        return next((line for line, k, _ in self._top if k == key), self.start())


def _first(text: str) -> int:
    return len(text) - len(text.lstrip())


def _items(text: str, i: int) -> list[tuple[int, Any, int]]:
    """``(line, key or None, value start)`` of each item of the container opening at ``text[i]``."""
    if i >= len(text) or text[i] not in "[{":
        return []
    dec, out = json.JSONDecoder(), []
    is_obj, i = text[i] == "{", i + 1
    pos, line = 0, 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] in "]}":
            return out
        line, pos = line + text.count("\n", pos, i), i
        key = None
        if is_obj:
            key, i = dec.raw_decode(text, i)
            while text[i] in " \t\r\n:":
                i += 1
        start = i
        _, i = dec.raw_decode(text, i)
        out.append((line, key, start))


def read_json(path: str | Path, error: type[Exception] = UserError) -> tuple[Any, Lines]:
    """Parsed JSON and its :class:`Lines`; a syntax error names the file, line and column."""
    text = read_utf8(path, error)
    try:
        return json.loads(text), Lines(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None


def as_id(value: Any) -> str | None:
    """``value`` as an id string (module docstring), or None when it cannot be an id."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return None


def id_problem(value: Any, what: str = "id") -> str:
    """Why ``value`` is not an id, for a message: ``question_id must be ..., got true``."""
    hint = "; write it as a string if it is meant literally" if isinstance(value, bool | float) else ""
    return f"{what} must be a string or an integer, got {json.dumps(value, default=repr)[:60]}{hint}"


def normalize_id(value: Any, where: str, what: str = "id", error: type[Exception] = UserError) -> str:
    """``value`` as an id string (module docstring); ``where`` (``FILE:LINE``) starts the error."""
    out = as_id(value)
    if out is None:
        raise error(f"{where}: {id_problem(value, what)}")
    return out
