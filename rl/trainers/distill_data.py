"""The prompts of ``rl distill``: caption requests about the world's notes, or a prompt file's records.

Both give :class:`mm.model.adapter.Sample` prompts (PIL images, opened once and kept) with the dataset
answer when there is one (a note's caption; a record's ``answer``), so any adapter family takes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mm.data.format import read_notes
from mm.data.images import open_rgb
from mm.errors import UserError
from mm.model.adapter import Sample
from rl.trainers.distill_config import DistillDataConfig
from rl.trainers.grpo_files_data import PromptImages, read_prompts


class NotePrompts:
    """Caption requests about notes of one split: ``sample(i)`` asks ``prompt`` about note i's images, with
    the note's text as the answer; ``objects[i]`` are its categories (for CHAIR)."""

    def __init__(self, *, folder: str | Path, split: str, notes: int, prompt: str) -> None:
        root = Path(folder)
        if not (root / "notes.jsonl").is_file():
            raise UserError(f"data.folder={root} has no notes.jsonl; generate notes with `mm data world`")
        found = [n for n in read_notes(root, split=split) if n.text]
        found = found[:notes] if notes else found
        if not found:
            raise UserError(f"data.folder={root}: no {split!r} notes with a caption; check data.split")
        self.notes, self.root, self.prompt = found, root, prompt
        self.objects = [set(n.categories) for n in found]
        self._images: dict[int, list[Any]] = {}

    def __len__(self) -> int:
        return len(self.notes)

    def sample(self, i: int) -> Sample:
        if i not in self._images:
            self._images[i] = [open_rgb(self.root / p) for p in self.notes[i].images]
        return Sample(images=self._images[i], text=self.prompt, answer=self.notes[i].text)


class FilePrompts:
    """The records of a prompt file (``rl grpo --prompts`` format); ``answer`` (optional) is the dataset
    answer."""

    def __init__(self, *, path: str | Path, image_folder: str | Path | None) -> None:
        self.records = read_prompts(path, image_folder or None)
        for r in self.records:
            answer = r.record.get("answer")
            if answer is not None and (not isinstance(answer, str) or not answer.strip()):
                raise UserError(f"{r.where}: 'answer' must be a non-empty string when present")
        self.images = PromptImages(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def sample(self, i: int) -> Sample:
        s = self.images.sample(i)
        return Sample(images=s.images, text=s.text, answer=self.records[i].record.get("answer"))


def build_prompts(cfg: DistillDataConfig) -> NotePrompts | FilePrompts:
    """The training prompts of ``cfg``: the prompt file when ``cfg.prompts`` is set, else the notes."""
    if cfg.prompts:
        return FilePrompts(path=cfg.prompts, image_folder=cfg.image_folder)
    return NotePrompts(folder=cfg.folder, split=cfg.split, notes=cfg.notes, prompt=cfg.caption_prompt)


def check_answers(prompts: NotePrompts | FilePrompts, cfg: DistillDataConfig, *, needs_dataset: bool) -> None:
    """Refuse ``data.off_policy=dataset`` when some prompt has no dataset answer."""
    if not needs_dataset or isinstance(prompts, NotePrompts):
        return
    missing = [r.where for r in prompts.records if r.record.get("answer") is None]
    if missing:
        raise UserError(
            f"data.off_policy=dataset needs an 'answer' in every record; {len(missing)} have none (first: "
            f"{missing[0]}); add answers or set data.off_policy=teacher"
        )
