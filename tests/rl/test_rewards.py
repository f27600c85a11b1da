"""Hallucination rewards: golden values, length neutrality, repeat-robustness, yes/no, combination."""

from __future__ import annotations

import math

import pytest

from rl.rewards import (
    Reward,
    RewardConfig,
    batch_scores,
    caption_reward,
    caption_terms,
    combine,
    mention_credits,
    score,
    vocabulary,
    yesno_reward,
)

GT = ["fork", "cup", "plate", "bottle"]  # g = 4


def test_caption_golden_values():
    # fork (covered), knives (hallucinated), mug -> cup (covered), knife again (hallucinated again)
    text = "Two forks, a mug and some knives. Also a knife."
    t = caption_terms(text, GT, vocabulary("world"))
    assert t == {
        "coverage": 0.5,
        "hallucination": 0.5,
        "n_mentions": 4.0,
        "n_hallucinated": 2.0,
        "n_covered": 2.0,
        "n_objects": 4.0,
    }
    assert caption_reward(text, GT) == 0.0
    cfg = RewardConfig(coverage_weight=1.0, hallucination_weight=2.0)
    assert caption_reward(text, GT, cfg) == pytest.approx(0.5 - 2 * 0.5, abs=0)
    assert caption_reward("A fork, a cup, a dish and a flask.", GT) == 1.0
    assert caption_reward("", GT) == 0.0


def test_no_ground_truth_objects_normalises_by_one():
    assert caption_reward("Nothing in particular.", []) == 0.0
    assert caption_reward("A dog.", []) == -1.0


def test_padding_with_non_object_words_leaves_reward_unchanged():
    base = "A fork and a knife."
    padded = "In this lovely and very detailed photo I can clearly see a fork and also, on the left, a knife."
    assert caption_reward(base, GT) == caption_reward(padded, GT) == 0.25 - 0.25
    for cfg in (RewardConfig(), RewardConfig(coverage_weight=0.3, hallucination_weight=3.0)):
        r0, r1 = score(base, GT, cfg=cfg), score(padded, GT, cfg=cfg)
        assert r0 == r1


def test_repeating_a_correct_mention_does_not_inflate():
    once = "A fork and a knife."
    many = "A fork and a knife. A fork. Forks, forks and a dinner fork."
    assert caption_reward(many, GT) == caption_reward(once, GT)
    # but each hallucinated mention is penalised
    assert caption_reward("A fork and a knife and a knife.", GT) < caption_reward(once, GT)


def test_hallucinating_always_lowers_and_covering_always_raises():
    base = caption_reward("A fork.", GT)
    assert caption_reward("A fork and a dog.", GT) < base < caption_reward("A fork and a plate.", GT)


def test_unknown_ground_truth_object_is_an_error():
    with pytest.raises(ValueError, match="not in the world vocabulary"):
        caption_reward("a fork", ["spaceship"])


@pytest.mark.parametrize(
    ("answer", "label", "want"),
    [
        ("Yes.", "yes", 1.0),
        ("yes", "no", 0.0),
        ("No, there is not.", "no", 1.0),
        ("No, there is not.", "yes", 0.0),
        ("Not sure", "no", 0.0),  # vlmevalkit: unknown counts as wrong
        ("", "yes", 0.0),
        ("NO", "no", 1.0),
    ],
)
def test_yesno_reward(answer, label, want):
    assert yesno_reward(answer, label) == want


def test_yesno_parser_choice_matters():
    assert yesno_reward("", "yes", parser="original") == 1.0  # POPE evaluate.py: empty answer is "yes"
    assert yesno_reward("Yes.", "yes", parser="lmms") == 0.0  # lmms: exact match only
    with pytest.raises(ValueError, match="label must be"):
        yesno_reward("yes", "maybe")


def test_combine_weighted_sum_and_components():
    r = combine({"caption": 0.5, "yesno": 1.0}, {"caption": 2.0, "yesno": -1.0})
    assert r == Reward(total=0.0, components={"caption": 0.5, "yesno": 1.0})
    with pytest.raises(ValueError, match="no weight"):
        combine({"caption": 1.0, "length": 3.0}, {"caption": 1.0})


def test_score_caption_and_question():
    cfg = RewardConfig(caption_weight=2.0, yesno_weight=0.5, hallucination_weight=2.0)
    r = score("A fork and a knife.", GT, cfg=cfg)
    assert r.components == {"caption": 0.25 - 0.5, "coverage": 0.25, "hallucination": 0.25}
    assert r.total == 2.0 * (0.25 - 0.5)
    q = score("Yes", ["fork"], label="yes", cfg=cfg)
    assert q.total == 0.5 and q.components == {"yesno": 1.0}


def test_batch_scores_aligns_components():
    totals, comps = batch_scores(["A fork.", "No."], [["fork"], ["fork"]], labels=[None, "no"])
    assert totals == [1.0, 1.0]
    assert comps["caption"][0] == 1.0 and math.isnan(comps["caption"][1])
    assert math.isnan(comps["yesno"][0]) and comps["yesno"][1] == 1.0
    with pytest.raises(ValueError, match="one object list"):
        batch_scores(["a"], [])


def test_config_validation():
    with pytest.raises(ValueError, match="yesno_parser"):
        RewardConfig(yesno_parser="gpt")
    with pytest.raises(ValueError, match="hallucination_weight"):
        RewardConfig(hallucination_weight=-1)
    with pytest.raises(ValueError, match="vocab"):
        RewardConfig(vocab="imagenet")


def test_coco_vocabulary():
    cfg = RewardConfig(vocab="coco")
    assert caption_reward("A man holding a hot dog next to a dog.", ["person", "hot dog"], cfg) == 1.0 - 0.5


def test_config_loads_from_yaml(tmp_path):
    from mm.config import ConfigError, load_config

    p = tmp_path / "r.yaml"
    p.write_text("hallucination_weight: 2.5\nyesno_parser: original\n")
    cfg = load_config(RewardConfig, p)
    assert cfg.hallucination_weight == 2.5 and cfg.yesno_parser == "original"
    p.write_text("halucination_weight: 2.5\n")
    with pytest.raises(ConfigError):
        load_config(RewardConfig, p)


def test_mention_credits_golden_and_sum_to_the_caption_reward():
    """Credits land on the first token of the words that name objects (first covered +cov/g, repeat 0,
    hallucinated -h/g); the credits sum to the caption reward."""
    cfg = RewardConfig(coverage_weight=1.0, hallucination_weight=1.5)
    pieces = ["Two", " forks", ",", " a", " kn", "ife", " and", " a", " fork", ". A", " red", " cup", " and",
              " a", " computer", " keyboard", "."]  # fmt: skip
    got = mention_credits(pieces, GT, cfg)
    want = [0.0] * len(pieces)
    want[1] = 0.25  # forks: fork, covered first (g = 4)
    want[4] = -1.5 / 4  # kn|ife: knife, hallucinated, on the word's first token
    want[11] = 0.25  # cup
    want[15] = -1.5 / 4  # "computer keyboard" (a two-word form) is credited to its last word
    assert got == pytest.approx(want)  # the repeated "fork" (index 8) earns nothing
    assert sum(got) == pytest.approx(caption_reward("".join(pieces), GT, cfg))
    assert mention_credits([], GT, cfg) == []
    assert mention_credits(["Nothing", " here", "."], GT, cfg) == [0.0, 0.0, 0.0]
