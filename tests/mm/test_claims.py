"""Claims: extraction with spans (world grammar, COCO-style English), judging, questions, `mm eval claims`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mm.cli import main
from mm.data.format import ObjectAnnotation
from mm.eval.chair import Vocabulary, chair_scores
from mm.eval.claims import (
    ClaimQuestionConfig,
    NoteTruth,
    build_claim_questions,
    build_extractor,
    generative_scores,
    note_truth,
)
from mm.eval.claims.truth import image_truth
from mm.world import vocab
from mm.world.text import image_caption, note_caption

WORLD = (
    "Two photos from a kitchen. In the first photo, two red forks and a small blue mug at the top left. "
    "In the second photo, three knives (red, blue and green)."
)


def _view(caption, claims):
    return [(c.kind, c.object, c.value, c.text(caption), c.image) for c in claims]


def test_world_caption_claims_with_spans():
    claims = build_extractor("world").extract(WORLD)
    assert _view(WORLD, claims) == [
        ("exists", "fork", None, "forks", 0),
        ("attribute", "fork", "red", "red", 0),
        ("count", "fork", 2, "two", 0),
        ("exists", "cup", None, "mug", 0),
        ("attribute", "cup", "blue", "blue", 0),
        ("exists", "knife", None, "knives", 1),
        ("count", "knife", 3, "three", 1),
        ("attribute", "knife", "red", "red", 1),
        ("attribute", "knife", "blue", "blue", 1),
        ("attribute", "knife", "green", "green", 1),
    ]
    assert claims[0].span == (55, 60) and claims[1].span == (51, 54) and claims[1].noun_span == (55, 60)
    assert build_extractor("world").extract("A photo. It shows a dinner fork.")[0].span == (20, 31)


def test_coco_sentence_claims_with_spans():
    cap = "Two brown dogs sit next to a red fire hydrant; a man holds 2 umbrellas."
    assert _view(cap, build_extractor("coco").extract(cap)) == [
        ("exists", "dog", None, "dogs", None),
        ("attribute", "dog", "brown", "brown", None),
        ("count", "dog", 2, "Two", None),
        ("exists", "fire hydrant", None, "fire hydrant", None),
        ("attribute", "fire hydrant", "red", "red", None),
        ("exists", "person", None, "man", None),
        ("exists", "umbrella", None, "umbrellas", None),
        ("count", "umbrella", 2, "2", None),
    ]


@pytest.mark.parametrize(
    "cap",
    [
        "A man riding a horse next to a toilet seat and a toilet.",
        "Baby elephants and a passenger train near a stop sign; two hot dogs on a plate.",
        "A cat's bowl, three teddy bears and a wine glass.",
    ],
)
def test_coco_exists_claims_are_chairs_mentions(cap):
    v = Vocabulary.coco()
    claims = [c.object for c in build_extractor("coco").extract(cap) if c.kind == "exists"]
    assert claims == [c for _, c in v.mentions(cap)]


def _random_objects(rng, n):
    out = []
    for _ in range(n):
        cat = vocab.CATEGORY_NAMES[int(rng.integers(len(vocab.CATEGORY_NAMES)))]
        color = vocab.COLORS[int(rng.integers(len(vocab.COLORS)))]
        out.append(ObjectAnnotation(category=cat, bbox=(0, 0, 8, 8), color=color, size="small"))
    return out


def test_world_generated_captions_claims_are_true_and_match_chair():
    """On the world's own captions every claim holds, and exists claims are CHAIR's mentions."""
    rng = np.random.default_rng(0)
    ex, v = build_extractor("world"), Vocabulary.world()
    for i in range(40):
        objs = [_random_objects(rng, int(rng.integers(1, 6))) for _ in range(int(rng.integers(1, 4)))]
        objs[0].append(objs[0][0])  # a duplicate: captions carry counts
        cap = (
            note_caption("kitchen", objs, size=64, rng=rng, synonym_prob=0.3)
            if i % 2
            else image_caption(objs[0], size=64, rng=rng, synonym_prob=0.3)
        )
        note = type("N", (), {"objects": objs if i % 2 else [objs[0]]})()
        truth = note_truth(note, v)
        res = generative_scores([("n", cap)], {"n": truth}, ex, n_boot=10)
        assert all(c["hallucinated"] is not True for c in res["per_caption"][0]["claims"]), cap
        kinds = res["kinds"]
        assert kinds["count"]["claims"] >= 1 and kinds["count"]["coverage"] == 1.0, cap
        assert kinds["exists"]["coverage"] == 1.0
        exists = [c.object for c in ex.extract(cap) if c.kind == "exists"]
        assert exists == [c for _, c in v.mentions(cap)]


def test_two_red_cups_where_one_blue_cup_is_caught():
    ex = build_extractor("world")
    truth = NoteTruth(images=(image_truth([("cup", "blue"), ("fork", "red")], ex.vocabulary, set()),))
    res = generative_scores([("a", "It shows two red cups and a fork.")], {"a": truth}, ex, n_boot=10)
    k = res["kinds"]
    assert (k["exists"]["rate"], k["exists"]["coverage"]) == (0.0, 1.0)
    assert (k["attribute"]["rate"], k["attribute"]["hallucinated"], k["attribute"]["coverage"]) == (
        1.0,
        1,
        0.0,
    )
    assert (k["count"]["rate"], k["count"]["facts"]) == (1.0, 0)
    cap = [{"image_id": "a", "caption": "It shows two red cups and a fork."}]
    chair = chair_scores(cap, {"a": ["cup", "fork"]}, ex.vocabulary)
    assert chair["chair_i"] == 0.0  # CHAIR passes it


def test_scope_absent_and_unknown_colours():
    ex = build_extractor("world")
    u: set[str] = set()
    truth = NoteTruth(
        images=(
            image_truth([("fork", "red")], ex.vocabulary, u),
            image_truth([("cup", None)], ex.vocabulary, u),
        )
    )
    cap = "Two photos. In the first photo, a cup. In the second photo, a red cup and two green dogs."
    res = generative_scores([("n", cap)], {"n": truth}, ex, n_boot=10)
    verdicts = [(c["kind"], c["object"], c["hallucinated"]) for c in res["per_caption"][0]["claims"]]
    assert verdicts == [
        ("exists", "cup", True),  # not in the first photo
        ("exists", "cup", False),
        ("attribute", "cup", None),  # colour unknown: not judged
        ("exists", "dog", True),
        ("attribute", "dog", None),  # object absent: not judged
        ("count", "dog", None),
    ]
    with pytest.raises(ValueError, match="no ground truth"):
        generative_scores([("x", "a cup")], {"n": truth}, ex)


def test_questions_balanced_true_and_seeded():
    ex = build_extractor("world")
    u: set[str] = set()
    images = {
        "i0": image_truth([("cup", "blue"), ("cup", "red"), ("fork", "green")], ex.vocabulary, u),
        "i1": image_truth([("dog", "white")], ex.vocabulary, u),
    }
    for split in ("random", "popular", "adversarial"):
        cfg = ClaimQuestionConfig(split=split, seed=3)
        qs, warns = build_claim_questions(images, cfg, categories=vocab.CATEGORY_NAMES)
        assert not warns and qs == build_claim_questions(images, cfg, categories=vocab.CATEGORY_NAMES)[0]
        for kind in ("exists", "attribute", "count"):
            mine = [q for q in qs if q["kind"] == kind]
            assert sum(q["label"] == "yes" for q in mine) * 2 == len(mine) > 0
        for q in qs:
            t = images[q["image"]].get(q["object"])
            truth = {
                "exists": t is not None,
                "attribute": t is not None and q["value"] in t.colors,
                "count": t is not None and q["value"] == t.count,
            }[q["kind"]]
            assert truth == (q["label"] == "yes"), q
    adv, _ = build_claim_questions(
        images, ClaimQuestionConfig(split="adversarial"), categories=vocab.CATEGORY_NAMES
    )
    texts = {q["text"] for q in adv}
    assert "Is there a green cup in this note?" in texts  # binding error: the fork's colour
    assert "Are there three cups in this note?" in texts  # off by one
    with pytest.raises(ValueError, match="split"):
        ClaimQuestionConfig(split="hard")


def test_cli_on_files(tmp_path, capsys):
    caps = tmp_path / "caps.json"
    caps.write_text(
        json.dumps(
            [{"image_id": 1, "caption": "Two red cups and a dog."}, {"image_id": 2, "caption": "A cup."}]
        )
    )
    objs = tmp_path / "objs.json"
    objs.write_text(json.dumps({"1": [{"category": "cup", "color": "blue"}], "2": ["cup", "cup"]}))
    assert main(["eval", "claims", "--captions", str(caps), "--objects", str(objs), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["generative"]
    k = res["kinds"]
    assert (k["exists"]["claims"], k["exists"]["hallucinated"], k["exists"]["rate"]) == (
        3,
        1,
        pytest.approx(1 / 3),
    )
    assert (k["attribute"]["rate"], k["count"]["rate"]) == (1.0, 1.0)
    lo, hi = k["exists"]["rate_ci"]
    assert 0.0 <= lo <= 1 / 3 <= hi <= 1.0
    q = tmp_path / "q.jsonl"
    assert (
        main(["eval", "claims", "--objects", str(objs), "--build-questions", str(q), "--split", "random"])
        == 0
    )
    rows = [json.loads(line) for line in q.read_text().splitlines()]
    (tmp_path / "a.jsonl").write_text(
        "".join(json.dumps({"question_id": r["question_id"], "text": r["label"]}) + "\n" for r in rows)
    )
    capsys.readouterr()
    assert (
        main(["eval", "claims", "--questions", str(q), "--answers", str(tmp_path / "a.jsonl"), "--json"]) == 0
    )
    disc = json.loads(capsys.readouterr().out)["discriminative"]["random"]
    assert disc["exists"]["accuracy"] == 1.0 and disc["count"]["f1"] == 1.0
    assert disc["count"]["intervals"]["f1"]["low"] == 1.0
    assert main(["eval", "claims", "--captions", str(caps)]) == 2
    assert "takes one of" in capsys.readouterr().err


def test_cli_on_tiny_notevlm(tmp_path, capsys):
    from tests.helpers.eval_model import make_data_dir, make_model_dir

    model, data = make_model_dir(tmp_path), make_data_dir(tmp_path)
    args = ["eval", "claims", "--model", str(model), "--data", str(data), "--split", "random", "adversarial"]
    assert main([*args, "--device", "cpu", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_notes"] == 2 and res["generative"]["n_captions"] == 2
    assert set(res["discriminative"]) == {"random", "adversarial"}
    adv = res["discriminative"]["adversarial"]
    assert adv["exists"]["n_questions"] == 10 and adv["count"]["n_questions"] == 10  # 5 objects, yes/no each
    assert 0.0 <= adv["exists"]["accuracy"] <= 1.0 and "f1" in adv["exists"]["intervals"]


def test_build_questions_from_a_note_folder_keys_image_paths(tmp_path, capsys):
    from tests.helpers.eval_model import make_data_dir

    data = make_data_dir(tmp_path)
    out = tmp_path / "q.jsonl"
    args = ["eval", "claims", "--objects", str(data), "--extractor", "world", "--build-questions", str(out)]
    assert main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["image"] for r in rows} == {"images/n0_0.png", "images/n1_0.png", "images/n1_1.png"}
    assert {r["kind"] for r in rows} == {"exists", "count"}  # the helper's objects have no colours
    assert all(r["question_id"].startswith("adversarial-") for r in rows)
