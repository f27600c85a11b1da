"""`mm eval` end to end: --json keys, readable tables, pope-build files, malformed-input errors."""

from __future__ import annotations

import json

import pytest

from mm.cli import main

POPE_KEYS = {"accuracy", "precision", "recall", "f1", "yes_ratio", "tp", "fp", "tn", "fn", "unparsed"}
CHAIR_KEYS = {"chair_s", "chair_i", "recall", "mean_length", "per_caption"}


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.fixture
def pope_files(tmp_path):
    qs = [
        {"question_id": 1, "image": "a.png", "text": "Is there a dog in the image?", "label": "yes"},
        {"question_id": 2, "image": "a.png", "text": "Is there a cat in the image?", "label": "no"},
        {"question_id": 3, "image": "b.png", "text": "Is there a cup in the image?", "label": "yes"},
        {"question_id": 4, "image": "b.png", "text": "Is there a fork in the image?", "label": "no"},
    ]
    ans = [(3, "No."), (1, "Yes."), (2, "NO"), (4, "no")]  # out of order on purpose
    q = _write(tmp_path / "q.jsonl", "".join(json.dumps(x) + "\n" for x in qs))
    a = _write(
        tmp_path / "a.jsonl", "".join(json.dumps({"question_id": i, "text": t}) + "\n" for i, t in ans)
    )
    return q, a


def test_pope_json(pope_files, capsys):
    q, a = pope_files
    assert main(["eval", "pope", "--questions", q, "--answers", a, "--parser", "original", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert POPE_KEYS <= set(res)
    # original: Y(yes) TP, 'NO' -> yes FP, N(yes) FN, no TN
    assert (res["tp"], res["fp"], res["tn"], res["fn"]) == (1, 1, 1, 1)
    assert res["accuracy"] == 0.5 and res["yes_ratio"] == 0.5 and res["parser"] == "original"


def test_pope_table_names_convention(pope_files, capsys):
    q, a = pope_files
    assert main(["eval", "pope", "--questions", q, "--answers", a, "--parser", "lmms"]) == 0
    out = capsys.readouterr().out
    assert "parser=lmms" in out and "lmms-eval" in out and "yes_ratio" in out and "unparsed 2" in out


def test_pope_answer_key_alias_and_missing_warns(tmp_path, pope_files, capsys):
    q, _ = pope_files
    a = _write(tmp_path / "a2.jsonl", '{"question_id": 1, "answer": "yes"}\n\n')
    assert main(["eval", "pope", "--questions", q, "--answers", a, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["missing_ids"] == ["2", "3", "4"]
    assert "warning: 3 question(s) have no answer" in captured.err


@pytest.mark.parametrize(
    "which,text,match",
    [
        ("answers", '{"question_id": 1, "text": "yes"}\n{oops\n', ":2: not valid JSON"),
        ("answers", '{"question_id": 1}\n', ":1: answer needs a string 'text'"),
        ("answers", "[1, 2]\n", ":1: expected a JSON object"),
        ("questions", '{"question_id": 1, "label": "maybe"}\n', ":1: label must be 'yes' or 'no'"),
        (
            "questions",
            '{"question_id": 1, "label": "yes"}\n{"question_id": 1, "label": "no"}\n',
            ":2: question_id",
        ),
        ("questions", '{"label": "yes"}\n', ":1: question has no 'question_id'"),
    ],
)
def test_pope_malformed(tmp_path, pope_files, capsys, which, text, match):
    q, a = pope_files
    bad = _write(tmp_path / "bad.jsonl", text)
    args = {"questions": q, "answers": a, which: bad}
    assert main(["eval", "pope", "--questions", args["questions"], "--answers", args["answers"]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.jsonl" + match in err


def test_pope_build_then_score(tmp_path, capsys):
    objects = _write(
        tmp_path / "o.json", json.dumps({"1": ["dog", "ball"], "2": ["cup"], "3": ["car", "bus"]})
    )
    out = tmp_path / "q.jsonl"
    argv = [
        "eval",
        "pope-build",
        "--objects",
        objects,
        "--split",
        "adversarial",
        "--out",
        str(out),
        "--seed",
        "3",
    ]
    assert main(argv) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 10 and sum(r["label"] == "yes" for r in rows) == 5
    first = out.read_text()
    assert main(argv) == 0 and out.read_text() == first  # seeded, reproducible
    answers = tmp_path / "a.jsonl"
    answers.write_text(
        "".join(json.dumps({"question_id": r["question_id"], "text": r["label"]}) + "\n" for r in rows)
    )
    capsys.readouterr()
    assert main(["eval", "pope", "--questions", str(out), "--answers", str(answers), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == 1.0


def test_pope_build_coco_instances(tmp_path):
    coco = {
        "images": [{"id": 1}, {"id": 2}],
        "categories": [{"id": 18, "name": "dog"}, {"id": 47, "name": "cup"}],
        "annotations": [{"image_id": 1, "category_id": 18}, {"image_id": 2, "category_id": 47}],
    }
    objects = _write(tmp_path / "instances.json", json.dumps(coco))
    out = tmp_path / "q.jsonl"
    assert main(["eval", "pope-build", "--objects", objects, "--split", "popular", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["image"], r["label"], r["text"]) for r in rows][:2] == [
        ("1", "yes", "Is there a dog in the image?"),
        ("1", "no", "Is there a cup in the image?"),
    ]


def test_pope_build_bad_input_writes_nothing(tmp_path, capsys):
    out = tmp_path / "q.jsonl"
    objects = _write(tmp_path / "o.json", '{\n  "1": ["dog"],\n  "2": "cat"\n}')
    assert main(["eval", "pope-build", "--objects", objects, "--out", str(out)]) == 2
    assert "o.json:3: image '2': expected a list" in capsys.readouterr().err
    assert not out.exists()
    empty = _write(tmp_path / "e.json", '{"1": []}')
    assert main(["eval", "pope-build", "--objects", empty, "--out", str(out)]) == 2
    assert not out.exists() and list(tmp_path.glob(".q.jsonl*")) == []
    bad = _write(tmp_path / "t.json", '{"1": ["dog"], "2": ["cat"]}')
    assert main(["eval", "pope-build", "--objects", bad, "--out", str(out), "--template", "Is it?"]) == 2
    assert "{object}" in capsys.readouterr().err and not out.exists()


def test_chair_json_and_table(tmp_path, capsys):
    caps = _write(
        tmp_path / "c.json", json.dumps([{"image_id": 9, "caption": "A cat on a sofa with a dog."}])
    )
    objs = _write(tmp_path / "o.json", json.dumps({"9": ["cat", "couch"]}))
    assert main(["eval", "chair", "--captions", caps, "--objects", objs, "--vocab", "coco", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert CHAIR_KEYS <= set(res)
    assert res["chair_i"] == pytest.approx(1 / 3) and res["chair_s"] == 1.0 and res["recall"] == 1.0
    assert res["per_caption"][0]["hallucinated"] == [["dog", "dog"]]
    assert main(["eval", "chair", "--captions", caps, "--objects", objs]) == 0
    out = capsys.readouterr().out
    assert "vocab=coco" in out and "original CHAIR rules" in out and "chair_i" in out


def test_chair_world_vocab(tmp_path, capsys):
    caps = _write(tmp_path / "c.json", json.dumps({"n1": "Two puppies and a mug."}))
    objs = _write(tmp_path / "o.json", json.dumps({"n1": [{"category": "dog"}, {"category": "cup"}]}))
    assert main(["eval", "chair", "--captions", caps, "--objects", objs, "--vocab", "world", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["vocab"] == "world" and res["chair_i"] == 0.0 and res["recall"] == 1.0


@pytest.mark.parametrize(
    "captions,objects,match",
    [
        (
            '[\n {"image_id": 1, "caption": "a dog"},\n {"image_id": 2}\n]',
            '{"1": [], "2": []}',
            "c.json:3: entry 1",
        ),
        ('[{"image_id": 1, "caption": "a dog"}', '{"1": []}', "c.json:1: not valid JSON"),
        ('[{"image_id": 1, "caption": "a dog"}]', '{"2": []}', "no ground-truth objects"),
        ('[{"image_id": 1, "caption": "a dog"}]', '{"1": [3]}', "o.json:1: image '1': object must be"),
    ],
)
def test_chair_malformed(tmp_path, capsys, captions, objects, match):
    caps = _write(tmp_path / "c.json", captions)
    objs = _write(tmp_path / "o.json", objects)
    assert main(["eval", "chair", "--captions", caps, "--objects", objs]) == 2
    err = capsys.readouterr().err
    assert match in err and err.startswith("mm eval: error:")


def test_missing_file(tmp_path, capsys):
    assert main(["eval", "chair", "--captions", str(tmp_path / "nope.json"), "--objects", "x"]) == 2
    assert "nope.json: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("sub", ["pope", "pope-build", "chair"])
def test_help(sub, capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", sub, "--help"])
    assert e.value.code == 0
    assert "usage: mm eval " + sub in capsys.readouterr().out


# ---- encodings, ids, duplicates: every problem is FILE:LINE or one warning ---------------------
def test_utf8_bom_is_accepted_in_every_file(tmp_path, capsys):
    bom = "\ufeff"
    q = _write(tmp_path / "q.jsonl", bom + json.dumps({"question_id": 1, "label": "yes"}) + "\n")
    a = _write(tmp_path / "a.jsonl", bom + json.dumps({"question_id": 1, "text": "Yes"}) + "\n")
    assert main(["eval", "pope", "--questions", q, "--answers", a, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == 1.0
    caps = _write(tmp_path / "c.json", bom + json.dumps([{"image_id": 1, "caption": "A dog."}]))
    objs = _write(tmp_path / "o.json", bom + json.dumps({"1": ["dog"]}))
    assert main(["eval", "chair", "--captions", caps, "--objects", objs, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recall"] == 1.0


@pytest.mark.parametrize("which", ["questions", "answers", "captions", "objects"])
def test_non_utf8_names_file_and_line(tmp_path, capsys, which):
    rows = {
        "questions": ['{"question_id": 1, "label": "yes"}', '{"question_id": 2, "label": "no"}'],
        "answers": ['{"question_id": 1, "text": "yes"}', '{"question_id": 2, "text": "no"}'],
        "captions": ['[{"image_id": 1, "caption": "a dog"},', ' {"image_id": 2, "caption": "a cat"}]'],
        "objects": ['{"1": ["dog"],', ' "2": ["cat"]}'],
    }
    paths = {}
    for name, lines in rows.items():
        paths[name] = tmp_path / f"{name}.txt"
        paths[name].write_text("\n".join(lines) + "\n")
    first, second = rows[which]  # a Latin-1 byte (0xe9) inside the second line's text:
    paths[which].write_bytes(
        f"{first}\n".encode() + second.replace('"', '"\xe9', 1).encode("latin-1") + b"\n"
    )
    if which in ("questions", "answers"):
        argv = ["eval", "pope", "--questions", str(paths["questions"]), "--answers", str(paths["answers"])]
    else:
        argv = ["eval", "chair", "--captions", str(paths["captions"]), "--objects", str(paths["objects"])]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mm eval: error: {paths[which]}:2: not UTF-8 text (byte 0xe9")


def test_ids_2_string_2_and_2_0_are_one_id(tmp_path, capsys):
    q = _write(
        tmp_path / "q.jsonl",
        '{"question_id": 2, "label": "yes"}\n{"question_id": "3", "label": "no"}\n'
        '{"question_id": 4.0, "label": "no"}\n',
    )
    a = _write(
        tmp_path / "a.jsonl",
        '{"question_id": 2.0, "text": "yes"}\n{"question_id": 3, "text": "no"}\n'
        '{"question_id": "4", "text": "no"}\n',
    )
    assert main(["eval", "pope", "--questions", q, "--answers", a, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_scored"] == 3 and res["accuracy"] == 1.0 and res["missing_ids"] == res["extra_ids"] == []
    caps = _write(tmp_path / "c.json", '[{"image_id": 2.0, "caption": "A dog."}]')
    objs = _write(tmp_path / "o.json", '{"2": ["dog"]}')
    assert main(["eval", "chair", "--captions", caps, "--objects", objs, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["per_caption"][0]["image_id"] == "2"


@pytest.mark.parametrize(
    "which, text, match",
    [
        (
            "answers",
            '{"question_id": 1, "text": "yes"}\n{"question_id": true, "text": "no"}\n',
            "bad.jsonl:2: ",
        ),
        ("questions", '{"question_id": false, "label": "yes"}\n', "bad.jsonl:1: "),
        ("questions", '{"question_id": null, "label": "yes"}\n', "bad.jsonl:1: "),
        ("answers", '{"question_id": 2.5, "text": "no"}\n', "bad.jsonl:1: "),
        (
            "questions",
            '{"question_id": 2, "label": "yes"}\n{"question_id": 2.0, "label": "no"}\n',
            "bad.jsonl:2: ",
        ),
    ],
)
def test_bad_question_ids_name_file_and_line(tmp_path, pope_files, capsys, which, text, match):
    q, a = pope_files
    bad = _write(tmp_path / "bad.jsonl", text)
    args = {"questions": q, "answers": a, which: bad}
    assert main(["eval", "pope", "--questions", args["questions"], "--answers", args["answers"]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match + "question_id" in err[0]


def test_bad_image_id_in_captions_names_file_and_line(tmp_path, capsys):
    caps = _write(
        tmp_path / "c.json", '[\n {"image_id": 1, "caption": "a"},\n {"image_id": true, "caption": "b"}\n]'
    )
    objs = _write(tmp_path / "o.json", '{"1": []}')
    assert main(["eval", "chair", "--captions", caps, "--objects", objs]) == 2
    err = capsys.readouterr().err
    assert "c.json:3: image_id must be a string or an integer, got true" in err


@pytest.mark.parametrize(
    "captions",
    [
        '[\n {"image_id": 1, "caption": "A dog."},\n {"image_id": 1.0, "caption": "A cat and a sofa."},\n'
        ' {"image_id": "1", "caption": "A cup."}\n]',
        '{\n "1": "A dog.",\n "1": "A cat and a sofa.",\n "1": "A cup."\n}',
    ],
)
def test_chair_duplicate_image_ids_keep_the_first_caption_with_one_warning(tmp_path, capsys, captions):
    caps = _write(tmp_path / "c.json", captions)
    objs = _write(tmp_path / "o.json", '{"1": ["dog"]}')
    assert main(["eval", "chair", "--captions", caps, "--objects", objs, "--json"]) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out)
    assert res["n_captions"] == 1 and res["per_caption"][0]["caption"] == "A dog." and res["chair_s"] == 0.0
    warns = [w for w in captured.err.splitlines() if "repeat an image_id" in w]
    assert len(warns) == 1 and warns == [w for w in captured.err.splitlines() if "c.json" in w]
    assert f"{caps}: 2 caption(s) repeat an image_id already captioned (first: '1' on line 3" in warns[0]
    assert any("repeat an image_id" in w for w in res["warnings"])


def test_objects_listing_an_image_twice_is_an_error(tmp_path, capsys):
    caps = _write(tmp_path / "c.json", '[{"image_id": 1, "caption": "A dog."}]')
    objs = _write(tmp_path / "o.json", '{\n "1": ["dog"],\n "2": [],\n "1": ["cat"]\n}')
    assert main(["eval", "chair", "--captions", caps, "--objects", objs]) == 2
    assert "o.json:4: image_id '1' is listed again (first on line 2)" in capsys.readouterr().err


def test_chair_caption_without_objects_names_file_and_line(tmp_path, capsys):
    caps = _write(
        tmp_path / "c.json", '[\n {"image_id": 1, "caption": "a"},\n {"image_id": 7, "caption": "b"}\n]'
    )
    objs = _write(tmp_path / "o.json", '{"1": []}')
    assert main(["eval", "chair", "--captions", caps, "--objects", objs]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{caps}:3: image_id '7' has no ground-truth objects in {objs}" in err[0]


def test_coco_instances_errors_name_file_and_line(tmp_path, capsys):
    coco = {
        "images": [{"id": 1}],
        "categories": [{"id": 18, "name": "dog"}],
        "annotations": [{"image_id": 1, "category_id": 18}, {"image_id": 1, "category_id": 99}],
    }
    objects = _write(tmp_path / "instances.json", json.dumps(coco, indent=1))
    assert main(["eval", "pope-build", "--objects", objects, "--out", str(tmp_path / "q.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "instances.json:18: annotations[1]: category_id 99 is not in 'categories'" in err  # fmt: skip
