"""The agent world's photos as a note folder, as the policy sees them: what a note model trains on.

    python -m rl.agent.world_export --out runs/agent_world0 --config configs/rl/agent.yaml --notes 8000

A pipeline-trained NoteVLM does not read the agent world's photos (``rl.agent.read_probe``): it never
saw a 256-px photo with a tray, nor a zoom crop of one. This writes the photos of the first ``--notes``
agent-world notes as an ``mm`` note folder (``notes.jsonl`` + PNGs, :mod:`mm.data.format`) on which the
project's own stages train a note model for ``policy.init`` (``mm pretrain``, ``mm train`` with
``configs/mm/align.yaml`` and ``configs/mm/sft.yaml``). Each photo becomes one note of three images, each
at the tower's input size and resized as the policy's processor resizes (PIL bilinear), so a training
image and the policy's view of the same pixels are the same array:

1. the whole photo (what the policy is given), captioned with its large objects and where the tray is,
   in the form a zoom call takes (``"... and a tray at [0.28, 0.5, 0.57, 0.79]."``), and annotated with the
   large objects only: the tiny objects are 2-3 px blobs there, which no caption should claim to read;
2. the tray as a detail demonstration's zoom takes it (:func:`rl.agent.world_demos.tray_box`), captioned
   and annotated with the tiny objects ("On the tray are two tiny cups (red and blue) and a tiny shell.");
3. one tiny object, its box padded by 0 to ``ZOOM_PAD`` source pixels (a change demonstration's zoom on
   the object, or on the changed region imgdiff reports), captioned with it.

The note text is :func:`rl.agent.world_tasks.reference_caption` of the photo. Notes keep their agent-world
split, so the agent's held-out notes stay unseen. Boxes are in the stored image's pixels.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from mm.data.format import Note, ObjectAnnotation, staged_folder, write_notes
from mm.errors import UserError
from mm.signals import sigterm_unwinds
from mm.world.detail import DetailScene, padded_box
from mm.world.generate import start_method
from mm.world.render import object_box
from mm.world.scene import SceneObject
from rl.agent.tools import box_pixels
from rl.agent.world_demos import normalised_box
from rl.agent.world_tasks import (
    TRAY_PAD,
    ZOOM_PAD,
    WorldTaskConfig,
    join_phrases,
    object_groups,
    photo,
    reference_caption,
    world_note,
)

VIEWS = ("photo", "tray", "object")
"""The images of an exported note, in order."""


def resized(image: np.ndarray, size: int) -> np.ndarray:
    """``image`` (H, W, 3 uint8) resized to (size, size, 3) as the NoteVLM processor resizes it."""
    return np.asarray(Image.fromarray(image).resize((size, size), Image.BILINEAR))


def view_objects(
    objs: Sequence[SceneObject], box: tuple[int, int, int, int], source: int, size: int
) -> list[ObjectAnnotation]:
    """``objs`` annotated in the ``size``-px image of the source crop ``box`` (boxes clipped to it)."""
    x0, y0, x1, y1 = box
    sx, sy = size / (x1 - x0), size / (y1 - y0)
    out = []
    for o in objs:
        a0, b0, a1, b1 = object_box(o, source)
        bb = (
            max(a0 - x0, 0) * sx,
            max(b0 - y0, 0) * sy,
            min(a1 - x0, x1 - x0) * sx,
            min(b1 - y0, y1 - y0) * sy,
        )
        out.append(ObjectAnnotation(category=o.category, bbox=tuple(round(v, 2) for v in bb), color=o.color,
                                    size=o.size))  # fmt: skip
    return out


def photo_note(
    note_id: str,
    split: str,
    scene: DetailScene,
    image: np.ndarray,
    pick: int,
    size: int,
    pad: int = ZOOM_PAD,
) -> tuple[Note, list[np.ndarray]]:
    """The exported note of one photo and its images: the object view shows tiny object ``pick``, its box
    padded by ``pad`` source pixels."""
    S = image.shape[0]
    whole = (0, 0, S, S)
    tray_call = normalised_box(
        list(padded_box(scene.tray, TRAY_PAD, S)), S, S
    )  # the demonstrations' zoom box
    tray = box_pixels(tray_call, S, S)  # what the zoom tool crops for it
    target = scene.tiny[pick]
    one = padded_box(object_box(target, S), pad, S)
    images = [resized(image[b[1] : b[3], b[0] : b[2]], size) for b in (whole, tray, one)]
    verb = "is" if len(scene.tiny) == 1 else "are"
    captions = [
        f"The photo shows {join_phrases(object_groups(scene.large, ''))} and a tray at "
        f"{json.dumps(tray_call)}.",
        f"On the tray {verb} {join_phrases(object_groups(scene.tiny, 'tiny '))}.",
        f"It is {object_groups([target], 'tiny ')[0]}.",
    ]
    objects = [
        view_objects(scene.large, whole, S, size),
        view_objects(scene.tiny, tray, S, size),
        view_objects([target], one, S, size),
    ]
    names = [f"images/{note_id}_{v}.png" for v in VIEWS]
    note = Note(id=note_id, images=names, text=reference_caption(scene), split=split, source="agent_world",
                image_captions=captions, objects=objects)  # fmt: skip
    return note, images


def _export_range(job: tuple[WorldTaskConfig, int, int, int, str]) -> list[Note]:
    """The photo notes of agent-world notes ``a .. b-1``, their images written under ``folder``."""
    cfg, a, b, size, folder = job
    made = []
    for index in range(a, b):
        wn = world_note(cfg, index)
        rng = np.random.default_rng([cfg.seed, index, 21])
        for k, scene in enumerate(wn.scenes):
            pick, pad = int(rng.integers(len(scene.tiny))), int(rng.integers(ZOOM_PAD + 1))
            note, images = photo_note(f"{wn.id}-{k}", wn.split, scene, photo(cfg, wn, k), pick, size, pad)
            for name, im in zip(note.images, images):
                Image.fromarray(im).save(Path(folder) / name)
            made.append(note)
    return made


def export_world(
    cfg: WorldTaskConfig,
    notes: int,
    out: str | Path,
    *,
    size: int = 64,
    overwrite: bool = False,
    workers: int = 1,
) -> int:
    """Write the photos of agent-world notes ``0 .. notes-1`` to ``out`` (module docstring); returns the
    number of exported notes (one per photo). ``out`` appears whole or not at all; ``workers`` > 1 forks
    that many processes (the same files as one)."""
    if notes < 1 or size < 16 or workers < 1:
        raise UserError(f"need --notes >= 1, --size >= 16 and --workers >= 1, got {notes}, {size}, {workers}")
    made: list[Note] = []
    with staged_folder(out, overwrite=overwrite) as tmp:
        (tmp / "images").mkdir()
        step = 250
        jobs = [(cfg, a, min(a + step, notes), size, str(tmp)) for a in range(0, notes, step)]
        if workers > 1 and len(jobs) > 1:
            with mp.get_context(start_method()).Pool(min(workers, len(jobs))) as pool:
                for part in pool.imap(_export_range, jobs):
                    made.extend(part)
        else:
            for job in jobs:
                made.extend(_export_range(job))
        write_notes(made, tmp)
    return len(made)


def main(argv: Sequence[str] | None = None) -> int:
    from mm.config import ConfigError, load_config
    from rl.agent.config import AgentRunConfig

    parser = argparse.ArgumentParser(
        prog="python -m rl.agent.world_export", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="note folder to write (must be missing or empty)")
    parser.add_argument(
        "--config",
        default=None,
        help="an rl agent config whose world section to export (default: the defaults)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set world.seed=1 world.detail.tray_spots=3",
    )  # fmt: skip
    parser.add_argument("--notes", type=int, default=8000, help="agent-world notes to export (default 8000)")
    parser.add_argument(
        "--size", type=int, default=64, help="stored image side: the tower's input (default 64)"
    )
    parser.add_argument("--workers", type=int, default=1, help="processes that render (default 1)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(AgentRunConfig, args.config, list(args.overrides))
        with sigterm_unwinds():
            n = export_world(
                cfg.world, args.notes, args.out, size=args.size, overwrite=args.overwrite,
                workers=args.workers,
            )  # fmt: skip
    except (UserError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {n} photo notes of world {cfg.world.seed} to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
