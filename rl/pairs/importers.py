"""Preference pairs from your own files, for ``rl dpo --model DIR --pairs PAIRS.jsonl --image-folder IMGS``.

One JSON object per line, in one of three layouts (``--pairs-format``; ``auto`` tells them apart by the
first record's keys):

- ``native``: ``image`` (a path relative to the image folder, or a list of them, in prompt order),
  ``question``, ``chosen``, ``rejected``, optional ``id``. Any other key is an error.
- ``rlaif-v`` (openbmb/RLAIF-V-Dataset, exported to JSONL): ``image`` is ``{"bytes": ..., "path": ...}``
  (bytes base64-encoded or a list of ints; else the path, relative to the image folder) or a path;
  ``image_path`` is the fallback; ``question``, ``chosen``, ``rejected``; ``idx`` becomes the id; ``ds_name``,
  ``origin_dataset``, ``origin_split`` are kept as metadata.
- ``rlhf-v`` (openbmb/RLHF-V-Dataset): ``text`` is a JSON string (or object) with ``question``,
  ``chosen``, ``rejected``; ``image`` and ``image_path`` as for RLAIF-V; ``idx`` becomes the id.

Every problem with a record (bad JSON, a missing key, a wrong type, a missing or unreadable image) is a
:class:`mm.errors.UserError` naming ``FILE:LINE``. Images are checked when the file is read and opened
again for each batch (:func:`open_images`), so a large set never sits decoded in memory.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm.data.images import check_image, open_rgb
from mm.errors import UserError

PAIR_FORMATS = ("auto", "native", "rlaif-v", "rlhf-v")
"""Values of ``--pairs-format`` / ``data.pairs_format``."""

NATIVE_KEYS = ("id", "image", "question", "chosen", "rejected")
"""Keys a native record may have (``id`` optional)."""
RLAIF_V_KEYS = ("ds_name", "origin_dataset", "origin_split", "idx", "image_path")
"""Keys only the released RLAIF-V / RLHF-V records have (metadata)."""
TEXT_KEYS = ("question", "chosen", "rejected")
"""The required text fields of every layout."""


@dataclass(frozen=True, kw_only=True)
class FilePair:
    """One preference pair about one or more images, read from a pairs file."""

    id: str
    """The record's ``id`` (``idx`` for RLAIF-V/RLHF-V), else ``FILE:LINE``."""
    images: tuple[Path | bytes, ...]
    """The images in prompt order: a file path, or encoded image bytes (PNG, JPEG ...) from the record."""
    question: str
    """The user's text after the images."""
    chosen: str
    """Preferred answer."""
    rejected: str
    """Dispreferred answer."""
    where: str
    """``FILE:LINE`` of the record (for errors later on)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """What else the record carried (RLAIF-V's ``origin_dataset`` ...)."""


class RecordError(ValueError):
    """A record does not fit its layout (the reader adds FILE:LINE)."""


# ---------------------------------------------------------------- one record per layout


def _text(rec: dict[str, Any], key: str) -> str:
    if key not in rec:
        raise RecordError(f"missing key {key!r} (a pair needs {', '.join(TEXT_KEYS)} and an image)")
    value = rec[key]
    if not isinstance(value, str):
        raise RecordError(f"{key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise RecordError(f"{key!r} is empty")
    return value


def _path(value: Any, folder: Path, key: str) -> Path:
    if not isinstance(value, str) or not value:
        raise RecordError(f"{key!r} must be a non-empty path string, got {type(value).__name__}")
    path = folder / value
    if not path.is_file():
        raise RecordError(f"image {path} not found ({key!r} is relative to the image folder {folder})")
    return path


def _bytes(value: Any) -> bytes:
    if isinstance(value, list) and all(isinstance(b, int) for b in value):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise RecordError("image 'bytes' is a string but not base64") from None
    raise RecordError(f"image 'bytes' must be base64 text or a list of ints, got {type(value).__name__}")


def _hf_image(rec: dict[str, Any], folder: Path) -> Path | bytes:
    """The image of a released RLAIF-V/RLHF-V record: inline bytes, else its path, else ``image_path``."""
    image = rec.get("image")
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            return _check_bytes(_bytes(image["bytes"]))
        if image.get("path"):
            return _path(image["path"], folder, "image.path")
    elif isinstance(image, str):
        return _path(image, folder, "image")
    elif image is not None:
        raise RecordError(f"'image' must be a path or {{'bytes', 'path'}}, got {type(image).__name__}")
    if rec.get("image_path"):
        return _path(rec["image_path"], folder, "image_path")
    raise RecordError("missing key 'image' (or 'image_path'): the record has no image")


def _check_bytes(data: bytes) -> bytes:
    try:
        check_image(data, verify=True)
    except UserError as e:
        raise RecordError(f"image 'bytes': {e}") from None
    return data


def native_pair(rec: dict[str, Any], folder: Path, where: str) -> FilePair:
    """A native record (see the module docstring)."""
    unknown = sorted(set(rec) - set(NATIVE_KEYS))
    if unknown:
        raise RecordError(
            f"unknown key(s) {unknown}; a native pair has {list(NATIVE_KEYS)} (released RLAIF-V/RLHF-V "
            "records: pass --pairs-format rlaif-v or rlhf-v)"
        )
    if "image" not in rec:
        raise RecordError("missing key 'image' (a path relative to the image folder, or a list of them)")
    image = rec["image"]
    paths = image if isinstance(image, list) else [image]
    if not paths:
        raise RecordError("'image' is an empty list: a pair needs at least one image")
    images = tuple(_path(p, folder, "image") for p in paths)
    pid = rec.get("id", where)
    if not isinstance(pid, (str, int)):
        raise RecordError(f"'id' must be a string or an integer, got {type(pid).__name__}")
    texts = {k: _text(rec, k) for k in TEXT_KEYS}
    return FilePair(id=str(pid), images=images, where=where, **texts)


def rlaif_v_pair(rec: dict[str, Any], folder: Path, where: str) -> FilePair:
    """A record of the released RLAIF-V dataset (see the module docstring)."""
    texts = {k: _text(rec, k) for k in TEXT_KEYS}
    meta = {k: rec[k] for k in RLAIF_V_KEYS if k in rec and k != "image_path"}
    return FilePair(
        id=str(rec.get("idx", where)), images=(_hf_image(rec, folder),), where=where, meta=meta, **texts
    )


def rlhf_v_pair(rec: dict[str, Any], folder: Path, where: str) -> FilePair:
    """A record of the released RLHF-V dataset: the texts are in the JSON of ``text``."""
    if "text" not in rec:
        raise RecordError("missing key 'text' (RLHF-V keeps question, chosen and rejected in it)")
    text = rec["text"]
    if isinstance(text, str):
        try:
            text = json.loads(text)
        except json.JSONDecodeError as e:
            raise RecordError(f"'text' is not JSON ({e.msg})") from None
    if not isinstance(text, dict):
        raise RecordError(f"'text' must hold a JSON object, got {type(text).__name__}")
    texts = {k: _text(text, k) for k in TEXT_KEYS}
    meta = {k: rec[k] for k in RLAIF_V_KEYS if k in rec and k != "image_path"}
    return FilePair(
        id=str(rec.get("idx", where)), images=(_hf_image(rec, folder),), where=where, meta=meta, **texts
    )


PARSERS = {"native": native_pair, "rlaif-v": rlaif_v_pair, "rlhf-v": rlhf_v_pair}
"""Layout name -> record parser."""


def detect_format(rec: dict[str, Any]) -> str | None:
    """The layout of a record from its keys, or None when it fits none unambiguously."""
    keys = set(rec)
    if "text" in keys and not keys & set(TEXT_KEYS):
        return "rlhf-v"
    if keys <= set(NATIVE_KEYS) and not isinstance(rec.get("image"), dict):
        return "native"
    if keys & set(RLAIF_V_KEYS) and keys >= set(TEXT_KEYS):
        return "rlaif-v"
    return None


# ---------------------------------------------------------------- files


def read_pair_file(
    path: str | Path, image_folder: str | Path, fmt: str = "auto"
) -> tuple[list[FilePair], str]:
    """All pairs of a JSONL file and the layout used; any bad record raises :class:`UserError` with
    ``FILE:LINE``. ``image_folder``: where relative image paths point."""
    p, folder = Path(path), Path(image_folder)
    if fmt not in PAIR_FORMATS:
        raise UserError(f"pairs format must be one of {', '.join(PAIR_FORMATS)}, got {fmt!r}")
    if not p.is_file():
        raise UserError(f"{p}: no such pairs file")
    if not folder.is_dir():
        raise UserError(f"image folder {folder} does not exist (image paths in {p} are relative to it)")
    pairs: list[FilePair] = []
    with p.open(encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{p}:{i}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not JSON ({e.msg}); one JSON object per line") from None
            if not isinstance(rec, dict):
                raise UserError(f"{where}: a pair must be a JSON object, got {type(rec).__name__}")
            if fmt == "auto":
                fmt = detect_format(rec) or ""
                if not fmt:
                    raise UserError(
                        f"{where}: cannot tell the pairs format from the keys {sorted(rec)}; pass "
                        "--pairs-format native, rlaif-v or rlhf-v"
                    )
            try:
                pairs.append(PARSERS[fmt](rec, folder, where))
            except RecordError as e:
                raise UserError(f"{where}: {e} [{fmt} format]") from None
    if not pairs:
        raise UserError(f"{p}: no pairs (the file is empty)")
    return pairs, fmt


def open_images(pair: FilePair) -> list[Any]:
    """The pair's images as RGB PIL images, in prompt order."""
    return [open_rgb(src, pair.where) for src in pair.images]
