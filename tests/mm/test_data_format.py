"""Note format: round trip, atomic write, bad records named by file and line."""

import json

import pytest

from mm.data.format import FormatError, Note, ObjectAnnotation, Question, read_notes, write_notes


def _note(i=0, **kw):
    return Note(
        id=f"w{i:06d}",
        images=[f"images/w{i:06d}_0.png", f"images/w{i:06d}_1.png"],
        text="A red fork and two knives.",
        image_captions=["A red fork.", "Two knives."],
        objects=[
            [
                ObjectAnnotation(
                    category="fork", bbox=(1, 2, 10, 12), color="red", size="small", occluded=0.25
                )
            ],
            [],
        ],
        questions=[Question("w_q0", "Is there a fork in image 1?", "yes", 0, "fork")],
        **kw,
    )


def test_round_trip(tmp_path):
    notes = [_note(0), _note(1, split="val", conversations=[{"from": "human", "value": "<image>\nhi"}])]
    write_notes(notes, tmp_path)
    back = read_notes(tmp_path)
    assert back == notes
    assert [n.id for n in read_notes(tmp_path, split="val")] == ["w000001"]
    line = json.loads((tmp_path / "notes.jsonl").read_text().splitlines()[0])
    assert list(line) == ["id", "split", "source", "images", "text", "image_captions", "objects", "questions"]
    assert line["objects"][0][0] == {
        "category": "fork", "color": "red", "size": "small", "bbox": [1, 2, 10, 12], "occluded": 0.25,
    }  # fmt: skip


def test_written_file_has_the_usual_mode(tmp_path):
    import os
    import stat

    path = write_notes([_note(0)], tmp_path)
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_defaults_fill_per_image_lists():
    n = Note(id="x", images=["a.png", "b.png"])
    assert n.image_captions == ["", ""] and n.objects == [[], []]


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("{not json", "notes.jsonl:2"),
        ('{"id": "x", "images": []}', "at least one image"),
        ('{"id": "x", "images": ["a.png"], "split": "dev"}', "split must be one of"),
        ('{"id": "x", "images": ["a.png"], "colour": 1}', "unknown key"),
        ('{"id": "x", "images": ["a.png"], "objects": [[{"category": "fork", "bbox": [1, 2]}]]}', "bbox"),
        ('{"id": "w000000", "images": ["a.png"]}', "duplicate note id"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, bad, match):
    write_notes([_note(0)], tmp_path)
    with (tmp_path / "notes.jsonl").open("a") as f:
        f.write(bad + "\n")
    with pytest.raises(FormatError, match=match) as e:
        read_notes(tmp_path)
    assert "notes.jsonl:2" in str(e.value)


def test_write_refuses_duplicates_and_leaves_nothing(tmp_path):
    with pytest.raises(FormatError, match="duplicate"):
        write_notes([_note(0), _note(0)], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_folder(tmp_path):
    with pytest.raises(FormatError, match="does not exist"):
        read_notes(tmp_path / "nope")
