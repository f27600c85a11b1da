"""File formats of the POPE / CHAIR evals: reading with ``file:line`` errors, atomic writing.

- POPE questions (JSONL): ``{"question_id", "image", "text", "label": "yes"|"no"}`` per line.
- POPE answers (JSONL): ``{"question_id", "text"}`` per line (``"answer"`` accepted for ``"text"``,
  as in the original POPE answer files).
- Objects (JSON): ``{image_id: [name, ...]}``; list items may also be ``{"category": name, ...}``
  (the note format); a COCO ``instances_*.json`` (``images`` / ``annotations`` / ``categories``)
  is read as ``{image_id: [category names]}``. An image id listed twice is an error.
- Captions (JSON): ``[{"image_id", "caption"}, ...]`` or ``{image_id: caption}``. An image captioned
  twice is scored once, by its first caption, with one warning naming the file and the count.

Files are UTF-8 (a BOM is fine). Ids follow :func:`mm.data.jsonio.normalize_id`: ``2``, ``"2"`` and
``2.0`` are the same id ``"2"``; ``true``, ``null`` or ``2.5`` as an id is an error. Every error
names the file and the line.
"""

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from mm.data.jsonio import Lines, normalize_id, read_json, read_jsonl
from mm.errors import UserError

__all__ = [
    "read_captions", "read_chair_files", "read_json", "read_jsonl", "read_objects", "read_pope_answers",
    "read_pope_questions", "write_jsonl",
]  # fmt: skip


def read_pope_questions(path: str | Path) -> list[dict[str, Any]]:
    """POPE questions (``question_id`` as a string); checks keys, labels and unique ids."""
    questions, seen = [], {}
    for line, q in read_jsonl(path):
        for key in ("question_id", "label"):
            if key not in q:
                raise UserError(f"{path}:{line}: question has no {key!r}; keys are {sorted(q)}")
        label = q["label"]
        if not isinstance(label, str) or label.strip().lower() not in ("yes", "no"):
            raise UserError(f"{path}:{line}: label must be 'yes' or 'no', got {label!r}")
        qid = normalize_id(q["question_id"], f"{path}:{line}", "question_id")
        if qid in seen:
            raise UserError(f"{path}:{line}: question_id {qid!r} already used on line {seen[qid]}")
        seen[qid] = line
        questions.append({**q, "question_id": qid})
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
        out.append((normalize_id(a["question_id"], f"{path}:{line}", "question_id"), a[key]))
    return out


def _object_name(where: str, image: str, item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("category"), str):
        return item["category"]
    raise UserError(f"{where}: image {image!r}: object must be a name or {{'category': name}}, got {item!r}")


def _read_coco_instances(path: str | Path, data: dict[str, Any], lines: Lines) -> dict[str, list[str]]:
    def bad(section: str, i: int, why: str) -> UserError:
        return UserError(f"{path}:{lines.member(section, i)}: {section}[{i}]: {why} (a COCO instances file)")

    for section in ("images", "annotations", "categories"):
        if not isinstance(data.get(section, []), list):
            raise UserError(f"{path}:{lines.start()}: {section!r} must be a list in a COCO instances file")
    names = {}
    for i, c in enumerate(data["categories"]):
        if not (isinstance(c, dict) and "id" in c and isinstance(c.get("name"), str)):
            raise bad("categories", i, "a category needs 'id' and a string 'name'")
        names[c["id"]] = c["name"]
    out: dict[str, list[str]] = {}
    for i, im in enumerate(data.get("images", [])):
        if not (isinstance(im, dict) and "id" in im):
            raise bad("images", i, "an image needs an 'id'")
        out[normalize_id(im["id"], f"{path}:{lines.member('images', i)}", "images[].id")] = []
    for i, ann in enumerate(data["annotations"]):
        if not (isinstance(ann, dict) and "image_id" in ann and "category_id" in ann):
            raise bad("annotations", i, "an annotation needs 'image_id' and 'category_id'")
        if ann["category_id"] not in names:
            raise bad("annotations", i, f"category_id {ann['category_id']!r} is not in 'categories'")
        image = normalize_id(ann["image_id"], f"{path}:{lines.member('annotations', i)}", "image_id")
        out.setdefault(image, []).append(names[ann["category_id"]])
    return out


def _repeated_keys(lines: Lines) -> list[tuple[int, str, int]]:
    """``(line, key, first line)`` for each top-level key that repeats an earlier one."""
    first: dict[str, int] = {}
    repeats = []
    for line, key in lines.keys():
        if key in first:
            repeats.append((line, key, first[key]))
        else:
            first[key] = line
    return repeats


def read_objects(path: str | Path) -> dict[str, list[str]]:
    """``{image_id: [object names]}`` from an objects JSON or a COCO instances file."""
    data, lines = read_json(path)
    if isinstance(data, dict) and {"annotations", "categories"} <= set(data):
        return _read_coco_instances(path, data, lines)
    if not isinstance(data, dict):
        raise UserError(
            f"{path}:{lines.start()}: expected a JSON object {{image_id: [objects]}}, "
            f"got {type(data).__name__}"
        )
    for line, key, first in _repeated_keys(lines)[:1]:
        raise UserError(
            f"{path}:{line}: image_id {key!r} is listed again (first on line {first}); "
            "give each image one list of objects"
        )
    out = {}
    for i, (image, objs) in enumerate(data.items()):
        where = f"{path}:{lines.item(i)}"
        if not isinstance(objs, list):
            raise UserError(f"{where}: image {image!r}: expected a list, got {type(objs).__name__}")
        out[image] = [_object_name(where, image, o) for o in objs]
    return out


def read_captions_located(
    path: str | Path, warn: list[str] | None = None
) -> list[tuple[int, dict[str, str]]]:
    """``(line, {"image_id", "caption"})`` per image, first caption kept (see the module docstring).

    The duplicate warning is appended to ``warn`` when given, else issued with :func:`warnings.warn`.
    """
    data, lines = read_json(path)
    if isinstance(data, dict):
        entries = [
            (lines.item(i), {"image_id": key, "caption": lines.value(i)})
            for i, (_, key) in enumerate(lines.keys())
        ]
    elif isinstance(data, list):
        entries = [(lines.item(i), c) for i, c in enumerate(data)]
    else:
        raise UserError(
            f"{path}:{lines.start()}: expected a list of {{'image_id', 'caption'}}, got {type(data).__name__}"
        )
    out, seen, repeats = [], {}, []
    for i, (line, c) in enumerate(entries):
        if not isinstance(c, dict) or "image_id" not in c or not isinstance(c.get("caption"), str):
            raise UserError(
                f"{path}:{line}: entry {i}: expected {{'image_id': ..., 'caption': str}}, "
                f"got {json.dumps(c)[:200]}"
            )
        image = normalize_id(c["image_id"], f"{path}:{line}", "image_id")
        if image in seen:
            repeats.append((line, image, seen[image]))
            continue
        seen[image] = line
        out.append((line, {"image_id": image, "caption": c["caption"]}))
    if repeats:
        line, image, first = repeats[0]
        msg = (
            f"{path}: {len(repeats)} caption(s) repeat an image_id already captioned (first: {image!r} on "
            f"line {line}, captioned on line {first}); only the first caption of each image is scored"
        )
        if warn is None:
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
        else:
            warn.append(msg)
    return out


def read_captions(path: str | Path, warn: list[str] | None = None) -> list[dict[str, str]]:
    """Captions as ``[{"image_id": str, "caption": str}]`` from a list or a mapping, one per image."""
    return [c for _, c in read_captions_located(path, warn)]


def read_chair_files(
    captions: str | Path, objects: str | Path
) -> tuple[list[dict[str, str]], dict[str, list[str]], list[str]]:
    """Captions, objects and warnings for CHAIR; a captioned image missing from ``objects`` is an error."""
    warn: list[str] = []
    located = read_captions_located(captions, warn)
    gt = read_objects(objects)
    missing = [(line, c["image_id"]) for line, c in located if c["image_id"] not in gt]
    if missing:
        line, image = missing[0]
        raise UserError(
            f"{captions}:{line}: image_id {image!r} has no ground-truth objects in {objects} "
            f"({len(missing)} captioned image id(s) have none, e.g. {[i for _, i in missing[:5]]}); "
            "the objects file must list every captioned image (use [] for an image with no objects)"
        )
    return [c for _, c in located], gt, warn


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
