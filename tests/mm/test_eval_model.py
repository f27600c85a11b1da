"""Model-driven POPE / CHAIR: smoke runs of the runners and `mm eval ... --model` on a tiny random NoteVLM."""

from __future__ import annotations

import json
import math

import pytest

from mm.cli import main
from mm.eval.runners import evaluate_model, held_out_notes, load_model, pope_questions, run_chair, run_pope
from tests.helpers.eval_model import make_data_dir, make_model_dir


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalmodel")
    return make_model_dir(root), make_data_dir(root)


@pytest.fixture(scope="module")
def loaded(dirs):
    return load_model(dirs[0], device="cpu")


def test_pope_questions_per_image_with_articles(dirs):
    notes = held_out_notes(dirs[1])
    qs, warns = pope_questions(notes, split="adversarial")
    assert not warns
    # images: n0_0 {fork, cup}, n1_0 {dog}, n1_1 {plate, knife} -> 5 yes + 5 no
    assert len(qs) == 10 and sum(q["label"] == "yes" for q in qs) == 5
    by_image = {}
    for q in qs:
        by_image.setdefault(q["image"], []).append(q)
    assert set(by_image) == {"images/n0_0.png", "images/n1_0.png", "images/n1_1.png"}
    present = {
        "images/n0_0.png": {"fork", "cup"},
        "images/n1_0.png": {"dog"},
        "images/n1_1.png": {"plate", "knife"},
    }
    for image, rows in by_image.items():
        for q in rows:
            assert (q["object"] in present[image]) == (q["label"] == "yes")
            assert q["text"] in (
                f"Is there a {q['object']} in this note?",
                f"Is there an {q['object']} in this note?",
            )
    anys = [q for q in pope_questions(notes, split="random", seed=3)[0] if q["object"][0] in "aeiou"]
    assert all(" an " in q["text"] for q in anys)


def test_run_pope_and_chair(dirs, loaded):
    model, proc = loaded
    notes = held_out_notes(dirs[1])
    pope = run_pope(model, proc, notes, dirs[1], split="adversarial", max_new_tokens=3, batch_size=4)
    assert pope["n_questions"] == 10 and pope["n_scored"] == 10
    assert pope["tp"] + pope["fp"] + pope["tn"] + pope["fn"] + pope["unparsed"] == 10
    assert len(pope["answers"]) == 10 and all(isinstance(a["text"], str) for a in pope["answers"])
    chair = run_chair(model, proc, notes, dirs[1], max_new_tokens=10, batch_size=1)
    assert chair["n_captions"] == 2 and chair["vocab"] == "world"
    assert chair["causes"]["total"] == chair["n_hallucinated"]
    # batching does not change greedy captions
    again = run_chair(model, proc, notes, dirs[1], max_new_tokens=10, batch_size=2)
    assert [r["caption"] for r in again["per_caption"]] == [r["caption"] for r in chair["per_caption"]]


def test_evaluate_model_summary(dirs, loaded):
    model, proc = loaded
    res = evaluate_model(
        dirs[0], dirs[1], max_new_tokens=8, model=model, processor=proc, pope_splits=("adversarial", "random")
    )
    assert res["n_notes"] == 2
    assert set(res["chair"]) >= {"chair_i", "chair_s", "recall", "mean_length"}
    assert set(res["pope"]) == {"adversarial", "random"}
    for s in res["pope"].values():
        assert 0.0 <= s["f1"] <= 1.0 and 0.0 <= s["yes_ratio"] <= 1.0 and s["n_questions"] == 10
    assert res["causes"]["total"] == res["chair"]["n_hallucinated"]
    assert all(not math.isnan(v) for v in res["chair"].values())
    json.dumps(res)  # JSON-ready


def test_cli_pope_and_chair_on_model(dirs, capsys):
    m, d = (str(x) for x in dirs)
    assert (
        main(
            [
                "eval",
                "pope",
                "--model",
                m,
                "--data",
                d,
                "--split",
                "adversarial",
                "--max-new-tokens",
                "2",
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert {"accuracy", "precision", "recall", "f1", "yes_ratio", "tp", "fp", "tn", "fn", "unparsed"} <= set(
        res
    )
    assert res["n_questions"] == 10 and res["split"] == "adversarial"
    assert main(["eval", "chair", "--model", m, "--data", d, "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "vocab=world" in out and "chair_i" in out and "hallucination causes" in out
    assert main(["eval", "chair", "--model", m, "--data", d, "--max-new-tokens", "6", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert {"chair_s", "chair_i", "recall", "mean_length", "per_caption", "causes"} <= set(res)


def test_cli_bad_inputs(dirs, tmp_path, capsys):
    m, d = (str(x) for x in dirs)
    assert main(["eval", "pope", "--model", m]) == 2
    assert "--model DIR and --data DIR" in capsys.readouterr().err
    assert main(["eval", "chair", "--model", m, "--data", d, "--captions", "c.json"]) == 2
    assert "plus --captions" in capsys.readouterr().err
    assert main(["eval", "chair", "--captions", "c.json"]) == 2
    assert "pass --captions and --objects" in capsys.readouterr().err
    assert main(["eval", "pope", "--model", str(tmp_path), "--data", d]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["eval", "chair", "--model", m, "--data", d, "--eval-split", "train"]) == 2
    assert "no 'train' notes" in capsys.readouterr().err
