"""Readers that turn real data files into notes (the format of :mod:`mm.data.format`).

- :func:`read_coco`: COCO ``captions_*.json`` (+ optional ``instances_*.json``) -> one single-image
  note per image. ``text`` and ``image_captions[0]`` are the image's first caption (lowest
  annotation id); objects come from instances with COCO category names, ``bbox`` converted from
  ``[x, y, w, h]`` to ``[x0, y0, x1, y1]`` and ``size`` from COCO's area rule (small < 32^2 <=
  medium < 96^2 <= large); colours are unknown (null).
- :func:`read_llava`: LLaVA conversation JSON (a list of ``{"id", "image", "conversations"}``;
  ``image`` may also be a list of files: a multi-image note) -> one note per record, ``text`` =
  the first ``gpt`` turn, conversations kept verbatim.
- :func:`read_pope`: POPE question JSONL (``{"question_id", "image", "text", "label"}`` per line)
  -> one note per image holding its yes/no questions.

Bad records never pass silently: with ``strict=True`` the first one raises
:class:`~mm.data.format.FormatError` naming the file and line (and, in JSON, the record's index);
otherwise it is skipped and counted in the returned :class:`ReadReport`. A referenced image that
is missing on disk is a bad record too. Files are UTF-8 (a BOM is fine; other bytes are an error
naming the line); ids follow :func:`mm.data.jsonio.normalize_id` (``2``, ``"2"`` and ``2.0`` are one
id; ``true`` is a bad record).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm.data.format import FormatError, Note, ObjectAnnotation, Question, staged_folder, write_notes
from mm.data.jsonio import Lines, as_id, id_problem, read_json, read_utf8

IMAGE_DIR = "images"
"""Converted notes reference their images as ``images/<file name>`` inside the output folder."""


@dataclass
class ReadReport:
    """What a reader kept and what it skipped (and why)."""

    source: str
    """File read."""
    notes: int = 0
    """Notes produced."""
    skipped: int = 0
    """Bad records skipped."""
    reasons: Counter = field(default_factory=Counter)
    """Skip reason -> count."""
    examples: list[str] = field(default_factory=list)
    """The first few skipped records as ``where: why``."""
    ignored: Counter = field(default_factory=Counter)
    """Well-formed records that do not apply (e.g. annotations of images not converted) -> count."""

    def skip(self, where: str | _At, why: str, *, strict: bool) -> None:
        """Count a bad record, or raise naming it when ``strict``."""
        if strict:
            raise FormatError(f"{where}: {why}")
        self.skipped += 1
        self.reasons[why.split(":")[0]] += 1
        if len(self.examples) < 10:
            self.examples.append(f"{where}: {why}")

    def summary(self) -> str:
        """One line for the CLI: kept, skipped, and the first skipped record."""
        s = f"{self.source}: {self.notes} notes, {self.skipped} bad records skipped"
        if self.skipped:
            s += f" ({dict(self.reasons)}; first: {self.examples[0]})"
        if self.ignored:
            s += f"; ignored {dict(self.ignored)}"
        return s


class _At:
    """``FILE:LINE: what``, the line looked up only when a message is written (large JSON files)."""

    def __init__(self, path: str | Path, lines: Lines, what: str, index: int, section: str | None = None):
        self.path, self.lines, self.what, self.index, self.section = path, lines, what, index, section

    def __str__(self) -> str:
        i = self.index
        line = self.lines.member(self.section, i) if self.section else self.lines.item(i)
        return f"{self.path}:{line}: {self.what}"


def _load_json(path: str | Path) -> tuple[Any, Lines]:
    return read_json(path, FormatError)


def _safe_id(s: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(s))


def _coco_size(area: float) -> str:
    return "small" if area < 32**2 else "medium" if area < 96**2 else "large"


def read_coco(
    captions: str | Path,
    instances: str | Path | None = None,
    *,
    images: str | Path,
    split: str = "train",
    strict: bool = False,
) -> tuple[list[Note], ReadReport]:
    """COCO captions (+ instances) -> single-image notes, in image-id order."""
    cap, cap_lines = _load_json(captions)
    report = ReadReport(source=str(captions))
    if (
        not isinstance(cap, dict)
        or not isinstance(cap.get("images"), list)
        or not isinstance(cap.get("annotations"), list)
    ):
        raise FormatError(
            f"{captions}:{cap_lines.start()}: expected a COCO captions file "
            "with 'images' and 'annotations' lists"
        )
    img_dir = Path(images)
    files: dict[int, str] = {}
    for i, im in enumerate(cap["images"]):
        where = _At(captions, cap_lines, f"images[{i}]", i, "images")
        if not (
            isinstance(im, dict) and isinstance(im.get("id"), int) and isinstance(im.get("file_name"), str)
        ):
            report.skip(where, "image record needs int 'id' and str 'file_name'", strict=strict)
        elif not (img_dir / im["file_name"]).is_file():
            report.skip(where, f"missing image file: {img_dir / im['file_name']}", strict=strict)
        else:
            files[im["id"]] = im["file_name"]
    texts: dict[int, tuple[int, str]] = {}
    for i, a in enumerate(cap["annotations"]):
        where = _At(captions, cap_lines, f"annotations[{i}]", i, "annotations")
        if not (
            isinstance(a, dict) and isinstance(a.get("caption"), str) and isinstance(a.get("image_id"), int)
        ):
            report.skip(where, "caption annotation needs int 'image_id' and str 'caption'", strict=strict)
            continue
        if a["image_id"] not in files:
            report.ignored["captions of skipped or unlisted images"] += 1
            continue
        key = (a.get("id", i) if isinstance(a.get("id", i), int) else i, a["caption"].strip())
        texts[a["image_id"]] = min(texts.get(a["image_id"], key), key)
    objects: dict[int, list[ObjectAnnotation]] = {k: [] for k in files}
    if instances is not None:
        inst, inst_lines = _load_json(instances)
        if not isinstance(inst, dict) or not isinstance(inst.get("annotations"), list):
            raise FormatError(
                f"{instances}:{inst_lines.start()}: expected a COCO instances file with an 'annotations' list"
            )
        cats = {c["id"]: c["name"] for c in inst.get("categories", []) if isinstance(c, dict) and "id" in c}
        for i, a in enumerate(inst["annotations"]):
            where = _At(instances, inst_lines, f"annotations[{i}]", i, "annotations")
            bbox = a.get("bbox") if isinstance(a, dict) else None
            if not (
                isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, int | float) for v in bbox)
            ):
                report.skip(where, f"bbox must be [x, y, w, h], got {bbox!r}", strict=strict)
                continue
            if a.get("category_id") not in cats:
                report.skip(where, f"unknown category_id: {a.get('category_id')!r}", strict=strict)
                continue
            if a.get("image_id") not in objects:
                report.ignored["instances of skipped or unlisted images"] += 1
                continue
            x, y, w, h = (float(v) for v in bbox)
            if w <= 0 or h <= 0:
                report.skip(where, f"empty bbox: {bbox!r}", strict=strict)
                continue
            area = float(a.get("area", w * h))
            objects[a["image_id"]].append(
                ObjectAnnotation(
                    category=cats[a["category_id"]], bbox=(x, y, x + w, y + h), size=_coco_size(area)
                )
            )
    notes = []
    for image_id in sorted(files):
        text = texts.get(image_id, (0, ""))[1]
        notes.append(
            Note(
                id=f"coco{image_id}",
                split=split,
                source="coco",
                images=[f"{IMAGE_DIR}/{files[image_id]}"],
                text=text,
                image_captions=[text],
                objects=[objects[image_id]],
            )
        )
    report.notes = len(notes)
    return notes, report


def read_llava(
    path: str | Path, *, images: str | Path, split: str = "train", strict: bool = False
) -> tuple[list[Note], ReadReport]:
    """LLaVA conversation JSON -> notes (records without an image are skipped: a note needs one)."""
    data, lines = _load_json(path)
    if not isinstance(data, list):
        raise FormatError(
            f"{path}:{lines.start()}: expected a JSON list of {{id, image, conversations}}, "
            f"got {type(data).__name__}"
        )
    report = ReadReport(source=str(path))
    img_dir = Path(images)
    notes, seen = [], set()
    for i, r in enumerate(data):
        where = _At(path, lines, f"record {i}", i)
        if not isinstance(r, dict) or "id" not in r:
            report.skip(where, "record needs an 'id'", strict=strict)
            continue
        rid = as_id(r["id"])
        if rid is None:
            report.skip(where, id_problem(r["id"]), strict=strict)
            continue
        where.what += f" (id {rid!r})"
        image = r.get("image")
        names = [image] if isinstance(image, str) else image
        if not (isinstance(names, list) and 1 <= len(names) and all(isinstance(x, str) for x in names)):
            report.skip(where, "no image (text-only records are not notes)", strict=strict)
            continue
        convs = r.get("conversations")
        if not (
            isinstance(convs, list)
            and convs
            and all(
                isinstance(t, dict) and t.get("from") in ("human", "gpt") and isinstance(t.get("value"), str)
                for t in convs
            )
        ):
            report.skip(
                where,
                "conversations must be a non-empty list of {from: human|gpt, value: str}",
                strict=strict,
            )
            continue
        missing = [x for x in names if not (img_dir / x).is_file()]
        if missing:
            report.skip(where, f"missing image file: {img_dir / missing[0]}", strict=strict)
            continue
        nid = f"llava_{_safe_id(rid)}"
        if nid in seen:
            report.skip(where, "duplicate id", strict=strict)
            continue
        seen.add(nid)
        answer = next((t["value"] for t in convs if t["from"] == "gpt"), "")
        notes.append(
            Note(
                id=nid,
                split=split,
                source="llava",
                images=[f"{IMAGE_DIR}/{x}" for x in names],
                text=answer,
                conversations=[{"from": t["from"], "value": t["value"]} for t in convs],
            )
        )
    report.notes = len(notes)
    return notes, report


_POPE_OBJECT = re.compile(r"is there an? (.+?) in the (?:image|picture|photo)", re.IGNORECASE)


def read_pope(
    path: str | Path, *, images: str | Path, split: str = "test", strict: bool = False
) -> tuple[list[Note], ReadReport]:
    """POPE question JSONL -> one note per image with its questions, in first-seen order.

    ``label`` is lower-cased (``yes``/``no``); ``object`` is parsed from "Is there a X in the image?".
    """
    p = Path(path)
    text = read_utf8(p, FormatError)
    report = ReadReport(source=str(p))
    img_dir = Path(images)
    by_image: dict[str, list[Question]] = {}
    seen_q: set[str] = set()
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            report.skip(where, f"not valid JSON: {e.msg}", strict=strict)
            continue
        if not isinstance(r, dict):
            report.skip(where, "line must be a JSON object", strict=strict)
            continue
        missing = [k for k in ("question_id", "image", "text", "label") if k not in r]
        if missing:
            report.skip(where, f"missing key(s): {missing}", strict=strict)
            continue
        label = str(r["label"]).strip().lower()
        if label not in ("yes", "no"):
            report.skip(where, f"label must be yes/no, got {r['label']!r}", strict=strict)
            continue
        raw_id = as_id(r["question_id"])
        if raw_id is None:
            report.skip(where, id_problem(r["question_id"], "question_id"), strict=strict)
            continue
        qid = f"pope_{_safe_id(raw_id)}"
        if qid in seen_q:
            report.skip(where, f"duplicate question_id: {raw_id!r}", strict=strict)
            continue
        if not (img_dir / str(r["image"])).is_file():
            report.skip(where, f"missing image file: {img_dir / str(r['image'])}", strict=strict)
            continue
        seen_q.add(qid)
        m = _POPE_OBJECT.search(str(r["text"]))
        q = Question(
            question_id=qid,
            question=str(r["text"]),
            answer=label,
            image=0,
            object=m.group(1) if m else None,
        )
        by_image.setdefault(str(r["image"]), []).append(q)
    notes = [
        Note(
            id=f"pope_{_safe_id(os.path.splitext(img)[0])}",
            split=split,
            source="pope",
            images=[f"{IMAGE_DIR}/{img}"],
            questions=qs,
        )
        for img, qs in by_image.items()
    ]
    report.notes = len(notes)
    return notes, report


def write_converted(
    notes: list[Note], *, images: str | Path, out: str | Path, overwrite: bool = False
) -> None:
    """Write ``notes`` to ``out`` with their images hard-linked (or copied) from ``images``; atomic."""
    src = Path(images)
    with staged_folder(out, overwrite=overwrite) as tmp:
        for n in notes:
            for rel in n.images:
                dst = tmp / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                if dst.exists():
                    continue
                s = src / Path(rel).relative_to(IMAGE_DIR)
                try:
                    os.link(s, dst)
                except OSError:
                    shutil.copy2(s, dst)
        write_notes(notes, tmp)
