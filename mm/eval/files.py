"""File formats of the POPE / CHAIR evals: reading with ``file:line`` errors, atomic writing.

- POPE questions (JSONL): ``{"question_id", "image", "text", "label": "yes"|"no"}`` per line.
- POPE answers (JSONL): ``{"question_id", "text"}`` per line (``"answer"`` accepted for ``"text"``,
  as in the original POPE answer files).
- Objects (JSON): ``{image_id: [name, ...]}``; list items may also be ``{"category": name, ...}``
  (the note format); a COCO ``instances_*.json`` (``images`` / ``annotations`` / ``categories``)
  is read as ``{image_id: [category names]}``.
- Captions (JSON): ``[{"image_id", "caption"}, ...]`` or ``{image_id: caption}``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mm.errors import UserError


def _read_text(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: not UTF-8 text ({e})") from None


def read_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line; a bad line raises ``file:line: why``."""
    out = []
    for i, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{i}: not valid JSON ({e.msg}); expected one object per line") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{i}: expected a JSON object, got {type(obj).__name__}")
        out.append((i, obj))
    return out


def read_json(path: str | Path) -> Any:
    """Parsed JSON; an error names the file, line and column."""
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None


def _top_level_lines(text: str) -> list[int]:
    """Line number of each item (list) or key (object) of a JSON document's top level."""
    dec, lines = json.JSONDecoder(), []
    i = len(text) - len(text.lstrip())
    if i >= len(text) or text[i] not in "[{":
        return lines
    is_obj, i = text[i] == "{", i + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] in "]}":
            return lines
        lines.append(text.count("\n", 0, i) + 1)
        _, i = dec.raw_decode(text, i)
        if is_obj:
            while text[i] in " \t\r\n:":
                i += 1
            _, i = dec.raw_decode(text, i)


def read_json_located(path: str | Path) -> tuple[Any, list[int]]:
    """Parsed JSON and the line of each top-level item (list) or key (object), for errors."""
    data = read_json(path)
    return data, _top_level_lines(_read_text(path))


def read_pope_questions(path: str | Path) -> list[dict[str, Any]]:
    """POPE questions; checks keys, labels and unique ids."""
    questions, seen = [], {}
    for line, q in read_jsonl(path):
        for key in ("question_id", "label"):
            if key not in q:
                raise UserError(f"{path}:{line}: question has no {key!r}; keys are {sorted(q)}")
        label = q["label"]
        if not isinstance(label, str) or label.strip().lower() not in ("yes", "no"):
            raise UserError(f"{path}:{line}: label must be 'yes' or 'no', got {label!r}")
        qid = str(q["question_id"])
        if qid in seen:
            raise UserError(f"{path}:{line}: question_id {qid!r} already used on line {seen[qid]}")
        seen[qid] = line
        questions.append(q)
    return questions


def read_pope_answers(path: str | Path) -> list[tuple[str, str]]:
    """``(question_id, answer text)`` pairs in file order (duplicates kept for reporting)."""
    out = []
    for line, a in read_jsonl(path):
        if "question_id" not in a:
            raise UserError(f"{path}:{line}: answer has no 'question_id'; keys are {sorted(a)}")
        key = "text" if "text" in a else "answer" if "answer" in a else None
        if key is None or not isinstance(a[key], str):
            raise UserError(f"{path}:{line}: answer needs a string 'text' (or 'answer'); keys: {sorted(a)}")
        out.append((str(a["question_id"]), a[key]))
    return out


def _object_name(where: str, image: str, item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("category"), str):
        return item["category"]
    raise UserError(f"{where}: image {image!r}: object must be a name or {{'category': name}}, got {item!r}")


def read_objects(path: str | Path) -> dict[str, list[str]]:
    """``{image_id: [object names]}`` from an objects JSON or a COCO instances file."""
    data, lines = read_json_located(path)
    if isinstance(data, dict) and {"annotations", "categories"} <= set(data):
        try:
            names = {c["id"]: c["name"] for c in data["categories"]}
            out: dict[str, list[str]] = {str(im["id"]): [] for im in data.get("images", [])}
            for ann in data["annotations"]:
                out.setdefault(str(ann["image_id"]), []).append(names[ann["category_id"]])
        except (KeyError, TypeError) as e:
            raise UserError(f"{path}: looks like COCO instances but is malformed ({e!r})") from None
        return out
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object {{image_id: [objects]}}, got {type(data).__name__}")
    out = {}
    for (image, objs), line in zip(data.items(), lines):
        where = f"{path}:{line}"
        if not isinstance(objs, list):
            raise UserError(f"{where}: image {image!r}: expected a list, got {type(objs).__name__}")
        out[str(image)] = [_object_name(where, image, o) for o in objs]
    return out


def read_captions(path: str | Path) -> list[dict[str, Any]]:
    """Captions as ``[{"image_id": str, "caption": str}]`` from a list or a mapping."""
    data, lines = read_json_located(path)
    if isinstance(data, dict):
        data = [{"image_id": k, "caption": v} for k, v in data.items()]
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a list of {{'image_id', 'caption'}}, got {type(data).__name__}")
    out = []
    for i, (c, line) in enumerate(zip(data, lines)):
        if not isinstance(c, dict) or "image_id" not in c or not isinstance(c.get("caption"), str):
            raise UserError(
                f"{path}:{line}: entry {i}: expected {{'image_id': ..., 'caption': str}}, "
                f"got {json.dumps(c)[:200]}"
            )
        out.append({"image_id": str(c["image_id"]), "caption": c["caption"]})
    return out


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write ``rows`` as JSONL atomically (temp file in the same folder, then rename)."""
    p = Path(path)
    if not p.parent.is_dir():
        raise UserError(f"{p}: folder {p.parent} does not exist; create it first")
    if p.is_dir():
        raise UserError(f"{p} is a folder; pass the path of the file to write")
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
