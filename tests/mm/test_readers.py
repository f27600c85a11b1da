"""Readers: COCO, LLaVA JSON, POPE JSONL on small files written here; bad records counted or named."""

import json

import cv2
import numpy as np
import pytest

from mm.cli import main
from mm.data.format import FormatError, read_notes
from mm.data.readers import read_coco, read_llava, read_pope


def _img(folder, name):
    folder.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(folder / name), np.full((8, 8, 3), 100, np.uint8))


@pytest.fixture
def coco(tmp_path):
    imgs = tmp_path / "imgs"
    _img(imgs, "a.jpg")
    _img(imgs, "b.jpg")
    images = [
        {"id": 1, "file_name": "a.jpg"},
        {"id": 2, "file_name": "b.jpg"},
        {"id": 3, "file_name": "gone.jpg"},
    ]
    caps = {
        "images": images,
        "annotations": [
            {"id": 9, "image_id": 1, "caption": "A dog on a bench. "},
            {"id": 5, "image_id": 1, "caption": "A dog sits."},
            {"id": 6, "image_id": 2, "caption": "Two cars."},
            {"id": 7, "image_id": 3, "caption": "Lost."},
        ],
    }
    inst = {
        "images": images,
        "categories": [{"id": 18, "name": "dog"}, {"id": 3, "name": "car"}],
        "annotations": [
            {"image_id": 1, "category_id": 18, "bbox": [10, 20, 30, 40], "area": 900},
            {"image_id": 2, "category_id": 3, "bbox": [0, 0, 100, 100], "area": 10000},
            {"image_id": 2, "category_id": 99, "bbox": [0, 0, 1, 1]},
            {"image_id": 2, "category_id": 3, "bbox": [0, 0]},
        ],
    }
    (tmp_path / "captions.json").write_text(json.dumps(caps, indent=1))  # images[i] on line 3 + 4 i
    (tmp_path / "instances.json").write_text(json.dumps(inst))
    return tmp_path


def test_coco_notes_objects_and_report(coco):
    notes, report = read_coco(coco / "captions.json", coco / "instances.json", images=coco / "imgs")
    assert [n.id for n in notes] == ["coco1", "coco2"]
    assert notes[0].text == "A dog sits." and notes[0].image_captions == [
        "A dog sits."
    ]  # lowest annotation id
    dog = notes[0].objects[0][0]
    assert (dog.category, dog.bbox, dog.size, dog.color) == ("dog", (10.0, 20.0, 40.0, 60.0), "small", None)
    assert notes[1].objects[0][0].size == "large"
    assert report.notes == 2 and report.skipped == 3  # missing image, unknown category, bad bbox
    assert report.ignored == {"captions of skipped or unlisted images": 1}
    assert "missing image file" in report.summary()
    with pytest.raises(FormatError, match=r"captions.json:11: images\[2\]: missing image file"):
        read_coco(coco / "captions.json", coco / "instances.json", images=coco / "imgs", strict=True)


def test_coco_cli_round_trip(coco, capsys):
    out = coco / "out"
    args = [
        "data",
        "coco",
        "--captions",
        str(coco / "captions.json"),
        "--instances",
        str(coco / "instances.json"),
    ]
    assert main([*args, "--images", str(coco / "imgs"), "--out", str(out), "--split", "val"]) == 0
    notes = read_notes(out)
    assert [n.split for n in notes] == ["val", "val"] and (out / notes[0].images[0]).is_file()
    assert "3 bad records skipped" in capsys.readouterr().err
    assert main([*args, "--images", str(coco / "imgs"), "--out", str(coco / "o2"), "--strict"]) == 2
    assert not (coco / "o2").exists()  # nothing half-written


def test_coco_bad_json_names_file_and_line(tmp_path):
    (tmp_path / "c.json").write_text('{"images": [\n  {"id": 1,,}]}')
    with pytest.raises(FormatError, match=r"c.json:2: not valid JSON"):
        read_coco(tmp_path / "c.json", images=tmp_path)


def test_llava(tmp_path):
    _img(tmp_path / "imgs", "x.png")
    _img(tmp_path / "imgs", "y.png")
    data = [
        {"id": "000001", "image": "x.png", "conversations": [
            {"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "A fork."}]},
        {"id": "2", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "3", "image": "x.png", "conversations": [{"from": "robot", "value": "?"}]},
        {"id": "4", "image": "nope.png", "conversations": [{"from": "human", "value": "?"}]},
        {"id": "5", "image": ["x.png", "y.png"], "conversations": [{"from": "gpt", "value": "Two."}]},
    ]  # fmt: skip
    (tmp_path / "l.json").write_text(
        "[\n" + ",\n".join(json.dumps(r) for r in data) + "\n]\n"
    )  # record i: line i+2
    notes, report = read_llava(tmp_path / "l.json", images=tmp_path / "imgs")
    assert [n.id for n in notes] == ["llava_000001", "llava_5"] and notes[0].text == "A fork."
    assert notes[1].images == ["images/x.png", "images/y.png"]  # a multi-image note
    assert notes[0].conversations[0]["value"].startswith("<image>")
    assert report.skipped == 3 and report.reasons["missing image file"] == 1
    with pytest.raises(FormatError, match=r"l.json:3: record 1 \(id '2'\): no image"):
        read_llava(tmp_path / "l.json", images=tmp_path / "imgs", strict=True)
    out = tmp_path / "out"
    assert (
        main(
            [
                "data",
                "llava",
                "--json",
                str(tmp_path / "l.json"),
                "--images",
                str(tmp_path / "imgs"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert read_notes(out) == notes


def test_pope(tmp_path):
    _img(tmp_path / "imgs", "COCO_1.jpg")
    lines = [
        {
            "question_id": 1,
            "image": "COCO_1.jpg",
            "text": "Is there a dining table in the image?",
            "label": "yes",
        },
        {"question_id": 2, "image": "COCO_1.jpg", "text": "Is there an apple in the image?", "label": "No"},
        {"question_id": 3, "image": "COCO_1.jpg", "text": "Is there a cat in the image?", "label": "maybe"},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n{broken\n"
    (tmp_path / "p.jsonl").write_text(text)
    notes, report = read_pope(tmp_path / "p.jsonl", images=tmp_path / "imgs")
    assert len(notes) == 1 and notes[0].split == "test"
    qs = notes[0].questions
    assert [(q.object, q.answer, q.image) for q in qs] == [("dining table", "yes", 0), ("apple", "no", 0)]
    assert report.skipped == 2
    with pytest.raises(FormatError, match=r"p.jsonl:3: label must be yes/no"):
        read_pope(tmp_path / "p.jsonl", images=tmp_path / "imgs", strict=True)


# ---- encodings and ids ---------------------------------------------------------------------------
def _pope_line(qid, image="COCO_1.jpg", label="yes"):
    return json.dumps(
        {"question_id": qid, "image": image, "text": "Is there a dog in the image?", "label": label}
    )


def test_pope_bom_ids_and_non_utf8(tmp_path):
    _img(tmp_path / "imgs", "COCO_1.jpg")
    p = tmp_path / "p.jsonl"
    p.write_text(
        "\ufeff" + "\n".join([_pope_line(2), _pope_line(2.0), _pope_line(True), _pope_line("3")]) + "\n"
    )
    notes, report = read_pope(p, images=tmp_path / "imgs")
    assert [q.question_id for q in notes[0].questions] == ["pope_2", "pope_3"]  # the BOM is not a bad record
    assert report.skipped == 2 and report.reasons["duplicate question_id"] == 1
    assert any(
        "p.jsonl:3: question_id must be a string or an integer, got true" in e for e in report.examples
    )
    p.write_bytes(_pope_line(1).encode() + b"\n" + _pope_line(2).encode().replace(b"dog", b"d\xe9g"))
    with pytest.raises(FormatError, match=r"p.jsonl:2: not UTF-8 text \(byte 0xe9"):
        read_pope(p, images=tmp_path / "imgs")


def test_data_cli_non_utf8_is_one_line_and_writes_nothing(tmp_path, capsys):
    _img(tmp_path / "imgs", "COCO_1.jpg")
    p = tmp_path / "p.jsonl"
    p.write_bytes(_pope_line(1).encode() + b"\n\xff\n")
    out = tmp_path / "out"
    assert (
        main(["data", "pope", "--questions", str(p), "--images", str(tmp_path / "imgs"), "--out", str(out)])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mm data: error: {p}:2: not UTF-8 text") and not out.exists()


def test_llava_bom_and_bad_ids(tmp_path):
    _img(tmp_path / "imgs", "x.png")
    conv = [{"from": "gpt", "value": "A fork."}]
    data = [
        {"id": 7.0, "image": "x.png", "conversations": conv},
        {"id": True, "image": "x.png", "conversations": conv},
    ]
    (tmp_path / "l.json").write_text("\ufeff[\n" + ",\n".join(json.dumps(r) for r in data) + "\n]\n")
    notes, report = read_llava(tmp_path / "l.json", images=tmp_path / "imgs")
    assert [n.id for n in notes] == ["llava_7"] and report.skipped == 1
    with pytest.raises(FormatError, match=r"l.json:3: record 1: id must be a string or an integer, got true"):
        read_llava(tmp_path / "l.json", images=tmp_path / "imgs", strict=True)


def test_coco_instances_errors_name_the_line(coco):
    inst = json.loads((coco / "instances.json").read_text())
    (coco / "instances.json").write_text(json.dumps(inst, indent=1))
    _, report = read_coco(coco / "captions.json", coco / "instances.json", images=coco / "imgs")
    assert f"{coco / 'instances.json'}:49: annotations[2]: unknown category_id: 99" in report.examples
