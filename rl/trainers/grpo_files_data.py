"""The prompt file of ``rl grpo --prompts``: one JSON object a line, images read once and kept.

    {"id": "p1", "image": "cats/001.jpg", "question": "Describe the image.", "objects": ["cat", "sofa"]}
    {"image": ["a.png", "b.png"], "question": "Is there a dog in the second image?", "answer": "no"}

``image``: a path or a list of paths, relative to the image folder (``data.image_folder``; default the
prompt file's folder) or absolute; ``question``: the user's text; ``id`` (default the line number) and
any other field go to the reward as ``record``. A bad line is one error naming ``file:line``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm.data.images import open_rgb
from mm.errors import UserError
from mm.model.adapter import Sample


@dataclass(frozen=True, kw_only=True)
class PromptRecord:
    """One line of the prompt file."""

    id: str
    """The record's ``id`` (or its line number)."""
    images: tuple[Path, ...]
    """Resolved image paths, in order."""
    question: str
    """The prompt text."""
    record: dict[str, Any]
    """The whole JSON object (given to the reward)."""
    where: str
    """``file:line`` for error messages."""


def read_prompts(path: str | Path, image_folder: str | Path | None = None) -> list[PromptRecord]:
    """Parse and check every line of ``path`` (images must exist); errors name ``file:line``."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"prompt file {p} not found; pass --prompts P.jsonl (one JSON object a line)")
    root = Path(image_folder) if image_folder else p.parent
    if not root.is_dir():
        raise UserError(f"image folder {root} not found; pass --image-folder DIR")
    out = []
    for n, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        image, question = rec.get("image"), rec.get("question")
        if not isinstance(question, str) or not question.strip():
            raise UserError(f"{where}: needs a non-empty 'question' (the prompt text)")
        names = [image] if isinstance(image, str) else image
        if not isinstance(names, list) or not names or not all(isinstance(x, str) for x in names):
            raise UserError(f"{where}: 'image' must be a path or a non-empty list of paths, got {image!r}")
        paths = tuple(root / x for x in names)
        missing = [str(x) for x in paths if not x.is_file()]
        if missing:
            raise UserError(f"{where}: image(s) not found: {missing}; check --image-folder ({root})")
        rid = str(rec.get("id", n))
        out.append(PromptRecord(id=rid, images=paths, question=question, record=rec, where=where))
    if not out:
        raise UserError(f"prompt file {p} has no prompts")
    return out


class PromptImages:
    """PIL images of the records, opened once (RGB) and kept."""

    def __init__(self, records: list[PromptRecord]) -> None:
        self.records = records
        self._cache: dict[Path, Any] = {}

    def _open(self, path: Path) -> Any:
        if path not in self._cache:
            self._cache[path] = open_rgb(path)
        return self._cache[path]

    def sample(self, i: int) -> Sample:
        """The :class:`mm.model.adapter.Sample` of record ``i`` (no answer)."""
        r = self.records[i]
        return Sample(images=[self._open(x) for x in r.images], text=r.question)
