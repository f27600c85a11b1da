"""Generate notes of the synthetic world and write them in the note format.

Note ``i`` is a pure function of ``(cfg, i)``: scenes and texts use ``default_rng([cfg.seed, i])``
and pixels (clutter, noise) a separate ``default_rng([cfg.seed, i, 1])`` (``caption_prior`` draws from a
third, ``[cfg.seed, i, 2]``), so a note is the same whether 100 or 20,000 are generated and whichever
worker makes it, and the visual difficulty knobs
(``clutter``, ``noise_std``) change pixels only, never scenes or texts.
Writing goes to a temporary sibling folder that is renamed into place at the end, so an
interrupted or failed run leaves nothing half-written.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from mm.config import to_dict
from mm.data.format import Note, ObjectAnnotation, note_line, staged_folder, write_notes
from mm.world import text, vocab
from mm.world.config import WorldConfig
from mm.world.png import encode_png
from mm.world.render import render_scene
from mm.world.scene import sample_scene
from mm.world.stats import cooccurrence_stats

IMAGE_DIR = "images"
"""Sub-folder of the output folder that holds the PNGs."""
CONFIG_FILE = "world.yaml"
"""The ``WorldConfig`` a folder was generated with (``mm data world --config`` reproduces it)."""
STATS_FILE = "stats.json"
"""``cooccurrence_stats`` of the folder's notes."""


_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def note_id(cfg: WorldConfig, index: int) -> str:
    """Id of note ``index``."""
    return f"{cfg.id_prefix}{index:06d}"


def generate_note(cfg: WorldConfig, index: int) -> tuple[Note, list[np.ndarray]]:
    """Note ``index`` and its images (each ``(S, S, 3)`` uint8 RGB), stored as ``images/<id>_<k>.png``."""
    rng = np.random.default_rng([cfg.seed, index])
    pixel_rng = np.random.default_rng([cfg.seed, index, 1])
    nid = note_id(cfg, index)
    theme = vocab.THEMES[int(rng.integers(len(vocab.THEMES)))]
    n_img = int(rng.integers(cfg.images_per_note_min, cfg.images_per_note_max + 1))
    u = rng.random()
    split = (
        "test" if u < cfg.test_fraction else "val" if u < cfg.test_fraction + cfg.val_fraction else "train"
    )
    images, objects = [], []
    keep: dict[str, bool] | None = {} if cfg.cooccurrence_scope == "note" else None
    for _ in range(n_img):
        scene = sample_scene(cfg, theme, rng, keep)
        img, anns = render_scene(
            scene,
            theme=theme,
            size=cfg.image_size,
            clutter=cfg.clutter,
            noise_std=cfg.noise_std,
            rng=pixel_rng,
        )
        images.append(img)
        objects.append(anns)
    S, sp, after = cfg.image_size, cfg.synonym_prob, cfg.colour_position == "after"
    told = caption_objects(objects, cfg.caption_prior, np.random.default_rng([cfg.seed, index, 2]))
    colour = text.ColourStyle(
        after=after,
        prob=cfg.colour_prob,  # below 1, a stream of its own: every other draw stays as at colour_prob 1
        rng=np.random.default_rng([cfg.seed, index, 3]) if cfg.colour_prob < 1.0 else None,
    )
    note = Note(
        id=nid,
        split=split,
        source="world",
        images=[f"{IMAGE_DIR}/{nid}_{k}.png" for k in range(n_img)],
        text=text.note_caption(theme, told, size=S, rng=rng, synonym_prob=sp, colour=colour),
        image_captions=[text.image_caption(o, size=S, rng=rng, synonym_prob=sp, colour=colour) for o in told],
        objects=objects,
        questions=text.questions(
            nid,
            objects,
            count=cfg.questions_per_note,
            partner_negatives=cfg.partner_negatives,
            rng=rng,
            synonym_prob=sp,
        ),
    )
    return note, images


def caption_objects(
    objects: list[list[ObjectAnnotation]], prior: float, rng: np.random.Generator
) -> list[list[ObjectAnnotation]]:
    """The objects a note's texts name: ``objects`` plus, with probability ``prior`` per anchor whose
    partner is absent from the whole note, a phantom partner (no colour or size, the anchor's box,
    ``occluded`` 1) in every image with that anchor (:attr:`WorldConfig.caption_prior`). ``objects``
    itself, the truth, is never changed; with ``prior`` 0 it is returned as is and ``rng`` is unused."""
    if prior <= 0.0:
        return objects
    present = {o.category for objs in objects for o in objs}
    told = {}  # anchor -> its phantom partner, in first-seen order (deterministic draws)
    for objs in objects:
        for o in objs:
            p = vocab.PARTNER_OF.get(o.category)
            if p is not None and p not in present and o.category not in told:
                told[o.category] = p if rng.random() < prior else None
    out = []
    for objs in objects:
        extra = []
        for o in objs:
            p = told.get(o.category)
            if p is not None and all(e.category != p for e in extra):
                extra.append(ObjectAnnotation(category=p, bbox=o.bbox, occluded=1.0))
        out.append(objs + extra)
    return out


def generate_notes(cfg: WorldConfig, start: int = 0, stop: int | None = None) -> list[Note]:
    """Notes ``start..stop`` (default: all ``cfg.notes``) without writing images (for stats, tests)."""
    stop = cfg.notes if stop is None else stop
    return [generate_note(cfg, i)[0] for i in range(start, stop)]


def _write_range(args: tuple[WorldConfig, int, int, str]) -> tuple[list[Note], list[str]]:
    """Write the images of notes ``start..stop`` into ``folder``; returns the notes and their JSON lines.

    One ``open``/``write``/``close`` per PNG relative to the folder's descriptor (no fsync: the
    whole folder is staged and renamed into place, see :func:`write_world`).
    """
    cfg, start, stop, folder = args
    noisy = cfg.noise_std > 0
    notes, lines = [], []
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        for i in range(start, stop):
            note, images = generate_note(cfg, i)
            for rel, img in zip(note.images, images):
                fd = os.open(rel, _FILE_FLAGS, 0o666, dir_fd=dir_fd)
                try:
                    data = encode_png(img, noisy=noisy)
                    if os.write(fd, data) != len(data):
                        raise OSError(f"short write to {os.path.join(folder, rel)}")
                finally:
                    os.close(fd)
            notes.append(note)
            lines.append(note_line(note))
    finally:
        os.close(dir_fd)
    return notes, lines


def start_method() -> str:
    """``fork`` (fast start) unless torch is loaded: forking a process with torch's thread pools can hang."""
    return "spawn" if "torch" in sys.modules else "fork"


def write_world(
    cfg: WorldConfig,
    out: str | Path,
    *,
    workers: int = 1,
    overwrite: bool = False,
    progress: bool = False,
) -> list[Note]:
    """Generate ``cfg.notes`` notes into ``out`` (notes.jsonl, images/, world.yaml, stats.json).

    ``out`` must not exist or be empty unless ``overwrite``; the folder appears complete or not at
    all. ``workers`` > 1 forks that many processes (same output as one); ``progress`` shows a bar.
    """
    from tqdm import tqdm  # function-level: ~0.2 s to import; only the progress bar needs it

    with staged_folder(out, overwrite=overwrite) as tmp:
        (tmp / IMAGE_DIR).mkdir()
        step = 250
        chunks = [(cfg, a, min(a + step, cfg.notes), str(tmp)) for a in range(0, cfg.notes, step)]
        workers = max(1, min(workers, len(chunks)))
        bar = tqdm(total=cfg.notes, unit="note", disable=not progress, desc="world")
        notes: list[Note] = []
        lines: list[str] = []

        def collect(part: tuple[list[Note], list[str]]) -> None:
            notes.extend(part[0])
            lines.extend(part[1])
            bar.update(len(part[0]))

        if workers > 1:
            with mp.get_context(start_method()).Pool(workers) as pool:
                for part in pool.imap(_write_range, chunks):
                    collect(part)
        else:
            for c in chunks:
                collect(_write_range(c))
        bar.close()
        write_notes(notes, tmp, lines=lines)
        (tmp / CONFIG_FILE).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        (tmp / STATS_FILE).write_text(json.dumps(cooccurrence_stats(notes), indent=1) + "\n")
    return notes


def with_notes(cfg: WorldConfig, notes: int | None = None, seed: int | None = None) -> WorldConfig:
    """``cfg`` with ``notes`` / ``seed`` replaced when given (CLI flags)."""
    changes = {k: v for k, v in (("notes", notes), ("seed", seed)) if v is not None}
    return replace(cfg, **changes) if changes else cfg
