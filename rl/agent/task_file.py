"""The task file of ``rl agent`` (``data.file`` trains, ``eval.file`` evaluates): users' notes and questions.

    tasks = read_task_file("tasks/train.jsonl", max_side=1024)    # list[AgentTask], kind "qa"

One JSON object a line, the ``rl grpo --prompts`` file with the agent's fields::

    {"id": "n1", "image": ["shelf/1.jpg", "shelf/2.jpg"], "text": "Our new shelf!",
     "question": "What colour is the small jar on the top shelf?", "answer": ["red", "dark red"],
     "demo": [{"name": "zoom", "image": 1, "box": [0.55, 0.05, 0.8, 0.3]}],
     "where": {"image": 1, "box": [0.6, 0.1, 0.7, 0.2]}}

- ``image`` (required): a path or a list of paths, the note's images in order (the tools number them from
  1), relative to ``image_folder`` (default: the file's folder) or absolute. Each is read once, turned
  upright by its EXIF orientation (phone photos), as RGB, and shrunk so its longest side is at most
  ``max_side`` (0 keeps it): that is the full resolution ``zoom`` crops from, so the memory a task file
  takes is about ``3 * max_side**2`` bytes per distinct image, or, with ``image_cache``
  (``data.image_cache``), that much disk, memory-mapped (:mod:`mm.data.image_cache`).
- ``question`` (required) and ``text`` (the note's text, optional; the policy reads it before the
  question).
- ``answer`` (required): the accepted answer, or a list of them; ``match``: ``"exact"`` (default) or
  ``"contains"`` (:mod:`rl.agent.qa`); ``choices`` (``contains`` only): the values an answer picks from,
  so a reply that also names another one is a hedge and wrong (default: numbers and yes / no).
- ``demo``: the tool calls a demonstration makes before it answers, each as the policy writes them
  (``rl.agent.parse``; boxes normalised to [0, 1]); the tool SFT replays them through the real tools, the
  no-tool SFT answers at once. Absent: both answer at once. ``demo_answer``: the demonstration's answer
  text (default: the first accepted answer).
- ``where``: where the answer is, ``{"image": k, "box": [x0, y0, x1, y1]}`` (normalised): the eval then
  reports whether the first zoom went there (``zoom_on_target/qa``) and ``grpo.zoom_reward_weight`` can
  reward it.
- ``id``: default the line number; ids must be unique. Any other field is kept in ``meta["record"]``.

Every line is checked before any training: a bad line is one :class:`mm.errors.UserError` naming
``file:line`` and how to fix it (missing images, demonstration calls the tools refuse or fail on, boxes
out of range).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mm.data.image_cache import ImageCache
from mm.data.images import open_rgb
from mm.data.jsonio import read_jsonl, read_utf8
from mm.errors import UserError
from rl.agent.parse import ParseError, parse_call
from rl.agent.qa import MATCHES, normalise
from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS, ToolRegistry, box_pixels
from rl.agent.world_demos import tool_text

FIELDS = ("id", "image", "text", "question", "answer", "match", "choices", "demo", "demo_answer", "where")
"""The fields the reader reads; others go to ``meta["record"]``."""


def _need_file(path: Path) -> None:
    if not path.is_file():
        raise UserError(
            f"task file {path} not found; set data.file / eval.file to a JSONL file, one task a line "
            "(rl.agent.task_file)"
        )


def file_digest(path: str | Path) -> str:
    """sha256 of the task file's bytes (a resumed run checks that its tasks did not change; the images are
    not read)."""
    p = Path(path)
    _need_file(p)
    return hashlib.sha256(p.read_bytes()).hexdigest()


def count_tasks(path: str | Path) -> int:
    """The number of tasks in the file: its non-blank lines (what :func:`read_task_file` gives)."""
    return sum(1 for line in read_utf8(path).split("\n") if line.strip())


def read_image(path: Path, max_side: int, where: str = "") -> np.ndarray:
    """``(H, W, 3)`` uint8 RGB, upright (:func:`mm.data.images.open_rgb`), the longest side at most
    ``max_side`` (0: any); an unreadable file is a ``UserError`` naming ``where``."""
    return np.asarray(open_rgb(path, where, max_side=max_side), dtype=np.uint8).copy()


def load_task_file(
    path: str | Path, *, image_folder: str | Path | None, max_side: int, image_cache: str | Path | None = None
) -> list[AgentTask]:
    """:func:`read_task_file` read once per process for the same file contents and settings (every stage of
    ``rl agent`` asks for the tasks; the images are decoded once)."""
    folder, cache = (None if x is None else str(x) for x in (image_folder, image_cache))
    return list(_cached(str(path), file_digest(path), folder, max_side, cache))


def data_tasks(path: str | Path, data: Any) -> list[AgentTask]:
    """:func:`load_task_file` with the settings of ``data``, an ``rl agent`` config's ``data`` section
    (``image_folder``, ``max_side``, ``image_cache``)."""
    return load_task_file(
        path, image_folder=data.image_folder, max_side=data.max_side, image_cache=data.image_cache
    )


@functools.lru_cache(maxsize=4)
def _cached(
    path: str, digest: str, image_folder: str | None, max_side: int, image_cache: str | None
) -> tuple[AgentTask, ...]:
    return tuple(read_task_file(path, image_folder=image_folder, max_side=max_side, image_cache=image_cache))


def read_task_file(
    path: str | Path,
    *,
    image_folder: str | Path | None = None,
    max_side: int = 1024,
    registry: ToolRegistry | None = None,
    image_cache: str | Path | None = None,
) -> list[AgentTask]:
    """Every task of ``path`` (module docstring), in file order; ``registry`` checks the demonstrations'
    calls (default: the loop's :data:`rl.agent.tools.TOOLS`); with ``image_cache`` (a folder) the images
    are decoded once into it and memory-mapped (:mod:`mm.data.image_cache`) instead of held in RAM."""
    p = Path(path)
    _need_file(p)
    root = Path(image_folder) if image_folder else p.parent
    if not root.is_dir():
        raise UserError(f"image folder {root} not found; set data.image_folder to the folder of the images")
    images: dict[Path, np.ndarray] = {}
    cache = None if image_cache is None else ImageCache(image_cache)

    def decode(path: Path, where: str) -> np.ndarray:
        if cache is None:
            return read_image(path, max_side, where)
        return cache.get(path, f"max_side={max_side}", lambda: read_image(path, max_side, where))

    tasks, seen = [], {}
    for n, rec in read_jsonl(p):
        where = f"{p}:{n}"
        task = _task(rec, n, where, root, images, decode, registry or TOOLS)
        if task.task_id in seen:
            raise UserError(
                f"{where}: id {task.task_id!r} is on line {seen[task.task_id]} too; ids must be unique"
            )
        seen[task.task_id] = n
        tasks.append(task)
    if not tasks:
        raise UserError(f"task file {p} has no tasks")
    return tasks


def _task(
    rec: dict[str, Any],
    n: int,
    where: str,
    root: Path,
    images: dict[Path, np.ndarray],
    decode: Callable[[Path, str], np.ndarray],
    registry: ToolRegistry,
) -> AgentTask:
    names = [rec.get("image")] if isinstance(rec.get("image"), str) else rec.get("image")
    if not isinstance(names, list) or not names or not all(isinstance(x, str) and x for x in names):
        raise UserError(
            f"{where}: 'image' must be a path or a non-empty list of paths, got {rec.get('image')!r}"
        )
    paths = [root / x for x in names]
    missing = [str(x) for x in paths if not x.is_file()]
    if missing:
        raise UserError(
            f"{where}: image(s) not found: {missing}; paths are relative to {root} (data.image_folder)"
        )
    for path in paths:
        if path not in images:
            images[path] = decode(path, where)
    sources = tuple(images[x] for x in paths)
    question, text = rec.get("question"), rec.get("text", "")
    if not isinstance(question, str) or not question.strip():
        raise UserError(f"{where}: needs a non-empty 'question'")
    if not isinstance(text, str):
        raise UserError(f"{where}: 'text' must be a string (the note's text), got {text!r}")
    answers = [rec.get("answer")] if isinstance(rec.get("answer"), str) else rec.get("answer")
    if (
        not isinstance(answers, list)
        or not answers
        or not all(isinstance(a, str) and a.strip() for a in answers)
    ):
        raise UserError(
            f"{where}: 'answer' must be a non-empty string or list of them, got {rec.get('answer')!r}"
        )
    empty = [a for a in answers if not normalise(a)]
    if empty:
        raise UserError(
            f"{where}: answer(s) {empty} have no words once normalised (rl.agent.qa); give words or numbers"
        )
    match = rec.get("match", "exact")
    if match not in MATCHES:
        raise UserError(f"{where}: 'match' must be one of {list(MATCHES)}, got {match!r}")
    choices = rec.get("choices")
    if choices is not None:
        if match != "contains":
            raise UserError(
                f'{where}: \'choices\' is read under "match": "contains" only; drop it or set match'
            )
        if not isinstance(choices, list) or not all(isinstance(c, str) and normalise(c) for c in choices):
            raise UserError(
                f"{where}: 'choices' must be a list of answers with words (rl.agent.qa), got {choices!r}"
            )
    demo_answer = rec.get("demo_answer", answers[0])
    if not isinstance(demo_answer, str) or not demo_answer.strip():
        raise UserError(f"{where}: 'demo_answer' must be a non-empty string, got {demo_answer!r}")
    meta: dict[str, Any] = {
        "answers": answers,
        "match": match,
        "choices": choices,
        "demo": _demo(rec.get("demo", []), where),
        "demo_answer": demo_answer,
        "record": {k: v for k, v in rec.items() if k not in FIELDS},
    }
    if "where" in rec:
        meta["image"], meta["box"] = _where(rec["where"], where, sources)
    task_id = rec.get("id", n)
    if not isinstance(task_id, (str, int)) or isinstance(task_id, bool):
        raise UserError(f"{where}: 'id' must be a string or an integer, got {task_id!r}")
    prompt = f"{text.strip()}\n{question.strip()}" if text.strip() else question.strip()
    task = AgentTask(str(task_id), "qa", sources, prompt, answers[0], meta)
    for k, call in enumerate(meta["demo"], 1):  # each call parsed and run once, as the loop would
        parsed = parse_call(tool_text(call), registry, n_images=len(sources))
        if isinstance(parsed, ParseError):
            raise UserError(f"{where}: demo call {k} {json.dumps(call)} is refused: {parsed.message}")
        obs = registry.run(parsed, task)
        if obs.text.startswith("error:"):  # a demonstration that shows an error would teach it
            raise UserError(f"{where}: demo call {k} {json.dumps(call)} fails: {obs.text}")
    return task


def _demo(calls: Any, where: str) -> list[dict[str, Any]]:
    """The demonstration's calls: a list of JSON objects (parsed and run once the task is built)."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise UserError(f"{where}: 'demo' must be a list of tool calls (JSON objects), got {calls!r}")
    return calls


def _where(value: Any, where: str, sources: tuple[np.ndarray, ...]) -> tuple[int, list[int]]:
    """``where`` as (image number, the box in that image's source pixels)."""
    ok = isinstance(value, dict) and set(value) == {"image", "box"}
    image, box = (value.get("image"), value.get("box")) if ok else (None, None)
    ok = ok and isinstance(image, int) and not isinstance(image, bool) and 1 <= image <= len(sources)
    ok = ok and isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)
    if not ok or not (0 <= box[0] < box[2] <= 1 and 0 <= box[1] < box[3] <= 1):
        raise UserError(
            f'{where}: \'where\' must be {{"image": k, "box": [x0, y0, x1, y1]}} with 1 <= k <= '
            f"{len(sources)} and 0 <= x0 < x1 <= 1, 0 <= y0 < y1 <= 1 (fractions of the image), got {value!r}"
        )
    H, W = sources[image - 1].shape[:2]
    return image, list(box_pixels(box, W, H))
