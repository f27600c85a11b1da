"""Inputs of POPE / CHAIR on a model from a user's files: questions or objects, and their image files.

    items = pope_items("pope_coco_adversarial.jsonl", "val2014")  # [PopeItem(where, question, image)]
    items = chair_items("instances_val2014.json", "val2014")      # [ChairItem(where, image_id, image, ...)]

Every image is checked to exist and to be an image file (its header) before a model is loaded; a
problem stops with ``FILE:LINE: what``.

Image files of POPE questions: the question's ``image`` (a path relative to the image folder, or
absolute). Image files of CHAIR objects, in this order: the ``file_name`` of a COCO instances file's
``images[]`` entry; ``IMAGES/<image_id>`` as written; ``IMAGES/<image_id>.<ext>`` for
:data:`IMAGE_EXTENSIONS`; for an integer id, COCO's zero-padded names ``<12 digits>.jpg`` and
``COCO_<split>_<12 digits>.jpg`` (the one match in the folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm.data.images import check_image as header_check
from mm.data.jsonio import read_json, read_jsonl
from mm.errors import UserError
from mm.eval.files import read_objects, read_pope_questions

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
"""Extensions tried after an image id that names no file as written."""


@dataclass(frozen=True)
class PopeItem:
    """One POPE question with the image it asks about."""

    where: str
    """``FILE:LINE`` of the question (for error messages)."""
    question: dict[str, Any]
    """The question record (``question_id`` normalised to a string, ``text``, ``label``, ...)."""
    image: Path
    """The image file (checked to exist)."""


@dataclass(frozen=True)
class ChairItem:
    """One image to caption, with its ground-truth objects."""

    where: str
    """``FILE:LINE`` of the image's entry in the objects file."""
    image_id: str
    """The image id (a string, as :func:`mm.data.jsonio.normalize_id` writes it)."""
    image: Path
    """The image file (checked to exist)."""
    objects: list[str]
    """Ground-truth object names."""


def check_image(path: Path, where: str, checked: set[Path]) -> None:
    """A `UserError` naming ``where`` unless ``path`` opens as an image (header only; once per path)."""
    if path not in checked:
        header_check(path, where)
        checked.add(path)


def default_image_folder(path: str | Path, image_folder: str | Path | None) -> Path:
    """``image_folder``, else the folder of ``path``; an error when it is not a folder."""
    folder = Path(image_folder) if image_folder is not None else Path(path).parent
    if not folder.is_dir():
        raise UserError(
            f"--image-folder {folder}: not a folder; pass the folder the image paths are relative to"
        )
    return folder


def pope_items(
    path: str | Path, image_folder: str | Path | None = None, *, limit: int | None = None
) -> list[PopeItem]:
    """POPE questions (``question_id``, ``image``, ``text``, ``label``) of ``path`` with their image files
    (the first ``limit``; the whole file is validated, only their images are checked)."""
    folder = default_image_folder(path, image_folder)
    questions = read_pope_questions(path)
    items, checked = [], set()
    located = list(zip(read_jsonl(path), questions))
    for (line, _), q in located[:limit] if limit else located:
        where = f"{path}:{line}"
        for key in ("image", "text"):
            if not isinstance(q.get(key), str) or not q[key].strip():
                raise UserError(f"{where}: question needs a non-empty string {key!r}; keys are {sorted(q)}")
        image = folder / q["image"]
        if not image.is_file():
            raise UserError(f"{where}: image {q['image']!r} not found in {folder} (looked for {image})")
        check_image(image, where, checked)
        items.append(PopeItem(where=where, question=q, image=image))
    if not items:
        raise UserError(f"{path}: no questions; nothing to evaluate")
    return items


def _coco_file_names(data: Any) -> dict[str, str]:
    """``{image_id: file_name}`` of a COCO instances file's ``images`` (ids as strings)."""
    out = {}
    if isinstance(data, dict) and isinstance(data.get("images"), list):
        for im in data["images"]:
            if isinstance(im, dict) and isinstance(im.get("file_name"), str) and "id" in im:
                out[str(im["id"])] = im["file_name"]
    return out


def find_image(folder: Path, image_id: str, file_name: str | None = None) -> tuple[Path | None, list[str]]:
    """The file of ``image_id`` in ``folder`` (see the module docstring) and the names tried."""
    tried = [file_name] if file_name else []
    tried += [image_id] + [image_id + ext for ext in IMAGE_EXTENSIONS]
    for name in tried:
        if (folder / name).is_file():
            return folder / name, tried
    if image_id.isdigit():
        padded = f"{int(image_id):012d}"
        tried += [f"{padded}.jpg", f"COCO_*_{padded}.jpg"]
        if (folder / f"{padded}.jpg").is_file():
            return folder / f"{padded}.jpg", tried
        matches = sorted(folder.glob(f"COCO_*_{padded}.jpg"))
        if len(matches) == 1:
            return matches[0], tried
    return None, tried


def chair_items(
    path: str | Path, image_folder: str | Path | None = None, *, limit: int | None = None
) -> list[ChairItem]:
    """The images of an objects file (``{image_id: [objects]}`` or COCO instances) with their files (the
    first ``limit`` images)."""
    folder = default_image_folder(path, image_folder)
    objects = read_objects(path)
    data, lines = read_json(path)
    names = _coco_file_names(data)
    coco = bool(names) or (isinstance(data, dict) and "annotations" in data)
    items, checked = [], set()
    entries = list(objects.items())
    for i, (image_id, objs) in enumerate(entries[:limit] if limit else entries):
        where = f"{path}:{lines.member('images', i) if coco else lines.item(i)}"
        image, tried = find_image(folder, image_id, names.get(image_id))
        if image is None:
            shown = ", ".join(tried[:4]) + (", ..." if len(tried) > 4 else "")
            raise UserError(
                f"{where}: image_id {image_id!r}: no image file in {folder} (tried {shown}); "
                "name the files after the ids or pass --image-folder"
            )
        check_image(image, where, checked)
        items.append(ChairItem(where=where, image_id=image_id, image=image, objects=objs))
    if not items:
        raise UserError(f"{path}: no images; nothing to caption")
    return items
