"""``rl.agent.world_export``: the agent world's photos as a note folder, as the processor sees them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from mm.data.format import read_notes
from mm.data.tokenizer import load_tokenizer
from mm.errors import UserError
from mm.model.processing import NoteProcessor
from mm.world.detail import padded_box
from rl.agent.tools import box_pixels
from rl.agent.world_demos import normalised_box
from rl.agent.world_export import VIEWS, export_world, main
from rl.agent.world_tasks import WorldTaskConfig, note_split, photo, world_note


def test_export_matches_the_world_and_the_processor(tmp_path):
    cfg = WorldTaskConfig(seed=3)
    assert export_world(cfg, 4, tmp_path / "out") == sum(len(world_note(cfg, i).scenes) for i in range(4))
    notes = read_notes(tmp_path / "out")
    assert [n.id for n in notes][:1] == ["aw3-000000-0"]
    for note in notes:
        index, k = int(note.id.split("-")[1]), int(note.id.split("-")[2])
        wn = world_note(cfg, index)
        scene = wn.scenes[k]
        assert note.split == note_split(cfg, index) and len(note.images) == len(VIEWS)
        # the photo view names the large objects only; the tray view every tiny object, with its colour
        assert [o.category for o in note.objects[0]] == [o.category for o in scene.large]
        assert [(o.category, o.color) for o in note.objects[1]] == [(o.category, o.color) for o in scene.tiny]
        assert "tiny" not in note.image_captions[0] and note.image_captions[1].startswith("On the tray")
        for tiny in scene.tiny:
            assert tiny.color in note.image_captions[1]
        (target,) = note.objects[2]
        assert (target.category, target.color) in [(o.category, o.color) for o in scene.tiny]
        assert note.image_captions[2] == f"It is a tiny {target.color} {target.category}."
        for objs in note.objects:
            for o in objs:
                x0, y0, x1, y1 = o.bbox
                assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64
    # the photo caption says where the tray is as the demonstrations' zoom call does, and the stored tray
    # view is the array the NoteVLM processor makes of what the zoom tool crops for that call
    note = notes[0]
    wn = world_note(cfg, 0)
    src = photo(cfg, wn, 0)
    call = normalised_box(list(padded_box(wn.scenes[0].tray, 2, src.shape[0])), 256, 256)
    assert note.image_captions[0].endswith(f" and a tray at {json.dumps(call)}.")
    x0, y0, x1, y1 = box_pixels(call, 256, 256)
    proc = NoteProcessor(tokenizer=load_tokenizer(), image_size=64, tokens_per_image=16, max_length=256)
    want = proc.load_image(np.ascontiguousarray(src[y0:y1, x0:x1]))  # (3, 64, 64)
    stored = proc.load_image(tmp_path / "out" / note.images[1])
    assert float((want - stored).abs().max()) <= 1 / 255 + 1e-6
    whole = proc.load_image(src)
    assert float((whole - proc.load_image(tmp_path / "out" / note.images[0])).abs().max()) <= 1 / 255 + 1e-6
    assert Image.open(tmp_path / "out" / note.images[2]).size == (64, 64)


def test_bad_arguments_and_existing_output_leave_nothing_half_written(tmp_path):
    with pytest.raises(UserError, match="--notes >= 1"):
        export_world(WorldTaskConfig(), 0, tmp_path / "none")
    assert not (tmp_path / "none").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="exists and is not empty"):
        export_world(WorldTaskConfig(), 1, tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


def test_cli(tmp_path, capsys):
    out = tmp_path / "o"
    assert (
        main(["--out", str(out), "--notes", "2", "--set", "world.seed=1", "world.detail.tray_spots=3"]) == 0
    )
    assert "photo notes of world 1" in capsys.readouterr().out
    notes = read_notes(out)
    assert notes and all(n.id.startswith("aw1-") for n in notes)
    spots = {"0.00", "0.35", "0.69"}  # the 3 spots' left/top edge, padded by 2 px, rounded down
    for n in notes:
        x0, y0 = json.loads(n.image_captions[0].rsplit(" at ", 1)[1].rstrip("."))[:2]
        assert f"{x0:.2f}" in spots and f"{y0:.2f}" in spots
    assert main(["--out", str(tmp_path / "bad"), "--set", "world.detail.tray_spots=1"]) == 2
    assert "tray_spots must be 0" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_workers_write_the_same_folder_as_one_process(tmp_path):
    cfg = WorldTaskConfig(seed=2)
    n = 260  # two chunks of notes
    assert export_world(cfg, n, tmp_path / "one") == export_world(cfg, n, tmp_path / "two", workers=2)
    assert (tmp_path / "one/notes.jsonl").read_text() == (tmp_path / "two/notes.jsonl").read_text()
    names = sorted(p.name for p in (tmp_path / "one/images").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two/images").iterdir())
    for name in names[:: max(1, len(names) // 20)]:
        assert (tmp_path / "one/images" / name).read_bytes() == (tmp_path / "two/images" / name).read_bytes()
    with pytest.raises(UserError, match="--workers >= 1"):
        export_world(cfg, 1, tmp_path / "none", workers=0)
