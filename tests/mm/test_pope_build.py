"""POPE question builder: balance, absence, popular = most frequent, adversarial = co-occurring."""

from __future__ import annotations

import pytest

from mm.eval.pope import PopeBuildConfig, build_questions, cooccurrence, objects_from_notes

# 'fork' and 'knife' always co-occur; 'cup' is the most frequent category overall.
OBJECTS = {
    "a": ["fork", "knife", "cup"],
    "b": ["fork", "knife", "cup"],
    "c": ["fork", "knife", "plate", "cup"],
    "d": ["cup", "dog"],
    "e": ["cup", "ball", "dog"],
    "f": ["knife", "tree", "tree"],  # duplicate objects count once
    "g": [],  # no objects: no questions
    "h": ["car"],
    "i": ["bus"],
    "j": ["sink"],
}
CATEGORIES = sorted({o for objs in OBJECTS.values() for o in objs})


def _by_image(questions):
    out: dict[str, dict[str, list[str]]] = {}
    for q in questions:
        obj = q["text"].removeprefix("Is there a ").removesuffix(" in the image?")
        out.setdefault(q["image"], {"yes": [], "no": []})[q["label"]].append(obj)
    return out


@pytest.mark.parametrize("split", ["random", "popular", "adversarial"])
def test_balanced_and_absent(split):
    qs, warns = build_questions(OBJECTS, PopeBuildConfig(split=split, seed=0))
    assert warns == []
    by = _by_image(qs)
    assert set(by) == set("abcdefhij")
    for image, d in by.items():
        assert sorted(d["yes"]) == sorted(set(OBJECTS[image]))  # every present object, once
        assert len(d["no"]) == len(d["yes"])  # balance per image
        assert not set(d["no"]) & set(OBJECTS[image])  # negatives are absent
        assert len(set(d["no"])) == len(d["no"])
        assert set(d["no"]) <= set(CATEGORIES)
    assert [q["question_id"] for q in qs] == list(range(1, len(qs) + 1))
    assert [q["label"] for q in qs[:4]] == ["yes", "no", "yes", "no"]  # yes/no pairs
    assert set(qs[0]) == {"question_id", "image", "text", "label"}


def test_popular_takes_most_frequent_absent():
    qs, _ = build_questions(OBJECTS, PopeBuildConfig(split="popular"))
    # frequencies (images): cup 5, knife 4, fork 3, dog 2, ball/bus/car/plate/sink/tree 1
    by = _by_image(qs)
    assert by["d"]["no"] == ["knife", "fork"]
    assert by["f"]["no"] == ["cup", "fork"]
    assert by["e"]["no"] == ["knife", "fork", "bus"]  # ties (1 image) broken by name


def test_adversarial_takes_most_cooccurring_absent():
    qs, _ = build_questions(OBJECTS, PopeBuildConfig(split="adversarial"))
    by = _by_image(qs)
    # image f has knife + tree: fork co-occurs with knife 3 times, cup 3 times, plate once
    assert by["f"]["no"] == ["cup", "fork"]  # tie at 3 broken by frequency: cup (5) > fork (3)
    # image d has cup + dog: with cup, knife 3 / fork 3; with dog, ball 1 (+ cup)
    assert by["d"]["no"] == ["knife", "fork"]
    freq, pairs = cooccurrence(OBJECTS)
    assert freq["cup"] == 5 and pairs[("fork", "knife")] == 3 and pairs[("knife", "fork")] == 3


def test_adversarial_differs_from_popular_when_cooccurrence_says_so():
    objects = {"1": ["a", "x"], "2": ["a", "x"], "3": ["b"], "4": ["b"], "5": ["b"], "6": ["a"]}
    adv, _ = build_questions(objects, PopeBuildConfig(split="adversarial"))
    pop, _ = build_questions(objects, PopeBuildConfig(split="popular"))
    assert _by_image(adv)["6"]["no"] == ["x"]  # x always appears with a
    assert _by_image(pop)["6"]["no"] == ["b"]  # b is the most frequent


def test_random_is_seeded():
    cfg = PopeBuildConfig(split="random", seed=7)
    assert build_questions(OBJECTS, cfg) == build_questions(OBJECTS, cfg)
    runs = {str(build_questions(OBJECTS, PopeBuildConfig(split="random", seed=s))[0]) for s in range(6)}
    assert len(runs) > 1


def test_template_per_image_and_categories():
    cfg = PopeBuildConfig(template="Does the photo contain {object}?", per_image=1, seed=1)
    qs, _ = build_questions(OBJECTS, cfg, categories=[*CATEGORIES, "zebra"])
    assert all(q["text"].startswith("Does the photo contain ") for q in qs)
    assert len(qs) == 2 * 9  # one yes + one no per non-empty image
    with pytest.raises(ValueError, match="category list"):
        build_questions(OBJECTS, PopeBuildConfig(), categories=["cup"])


def test_shortage_of_absent_categories_keeps_balance_and_warns():
    qs, warns = build_questions({"1": ["a", "b", "c"], "2": ["d"]}, PopeBuildConfig(split="popular"))
    by = _by_image(qs)
    assert len(by["1"]["yes"]) == len(by["1"]["no"]) == 1  # only 'd' is absent from image 1
    assert warns and "fewer absent" in warns[0]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"split": "hard"}, "random, popular, adversarial"),
        ({"template": "Is it?"}, "{object}"),
        ({"per_image": 0}, ">= 1"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PopeBuildConfig(**kwargs)


def test_objects_from_notes():
    from mm.data.format import Note, ObjectAnnotation

    def ann(cat):
        return ObjectAnnotation(category=cat, bbox=(0, 0, 1, 1))

    notes = [
        Note(id="n1", images=["images/n1_0.png", "images/n1_1.png"], objects=[[ann("dog"), ann("ball")], []]),
        Note(id="n2", images=["images/n2_0.png"], objects=[[ann("cup")]]),
    ]
    objs = objects_from_notes(notes)
    assert objs == {"images/n1_0.png": ["dog", "ball"], "images/n1_1.png": [], "images/n2_0.png": ["cup"]}
    qs, _ = build_questions(objs, PopeBuildConfig(split="popular"))
    assert {q["image"] for q in qs} == {"images/n1_0.png", "images/n2_0.png"}
