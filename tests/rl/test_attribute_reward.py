"""The colour term of the scene reward (``attribute_weight``): golden values on hand-written captions,
token credits, the GRPO token credits and the DPO on-policy scorer."""

from __future__ import annotations

import pytest

from mm.data.format import Note, ObjectAnnotation
from mm.eval.claims import note_truth
from rl.rewards import (
    RewardConfig,
    attribute_verdicts,
    batch_scores,
    caption_reward,
    caption_terms,
    char_tokens,
    mention_credits,
    score,
    vocabulary,
)


def _obj(category: str, color: str) -> ObjectAnnotation:
    return ObjectAnnotation(category=category, bbox=(0, 0, 4, 4), color=color)


# image 0: a red fork and a blue cup; image 1: a green fork. Ground truth {fork, cup}: g = 2
NOTE = Note(
    id="n0",
    images=["a.png", "b.png"],
    objects=[[_obj("fork", "red"), _obj("cup", "blue")], [_obj("fork", "green")]],
)
GT = sorted(NOTE.categories)
TRUTH = note_truth(NOTE, vocabulary("world"))
# "blue fork" in image 0: wrong; "blue cup": right; "red fork" in image 1: wrong (image 1's fork is green);
# "yellow dog": the dog is absent, so its colour is not judged (the mention is a hallucination already)
CAPTION = "In the first photo, a blue fork and a blue cup. In the second photo, a red fork and a yellow dog."


def test_verdicts_follow_the_image_the_sentence_names():
    got = attribute_verdicts(CAPTION, TRUTH, vocabulary("world"))
    assert got == [(CAPTION.index("blue fork"), True, ("fork", "blue")),
                   (CAPTION.index("blue cup"), False, ("cup", "blue")),
                   (CAPTION.index("red fork"), True, ("fork", "red"))]  # fmt: skip
    # without an image named, the note's colours count: a red fork is there (image 0)
    assert attribute_verdicts("A red fork and a green cup.", TRUTH, vocabulary("world")) == [
        (2, False, ("fork", "red")),
        (17, True, ("cup", "green")),
    ]
    # the bracketed list of the world grammar
    assert attribute_verdicts("Two forks (green and cyan).", TRUTH, vocabulary("world")) == [
        (11, False, ("fork", "green")),
        (21, True, ("fork", "cyan")),
    ]


def test_caption_golden_values():
    cfg = RewardConfig(attribute_weight=2.0)
    t = caption_terms(CAPTION, GT, vocabulary("world"), TRUTH)
    assert t["attribute"] == 1.0 and t["n_attribute_wrong"] == 2.0  # 2 wrong colours / g = 2
    assert t["coverage"] == 1.0 and t["hallucination"] == 0.5  # fork + cup covered; the dog
    r = score(CAPTION, GT, cfg=cfg, truth=TRUTH)
    assert r.total == pytest.approx(1.0 - 0.5 - 2.0 * 1.0)
    assert r.components == {
        "caption": -1.5, "coverage": 1.0, "hallucination": 0.5, "attribute": 1.0, "attribute_coverage": 0.5
    }  # fmt: skip
    assert t["attribute_coverage"] == 0.5 and t["n_attribute_right"] == 1.0  # the blue cup
    assert caption_reward(CAPTION, GT, cfg, TRUTH) == pytest.approx(-1.5)
    # right colours cost nothing, no colours cost nothing
    assert caption_reward("A red fork and a blue cup.", GT, cfg, TRUTH) == pytest.approx(1.0)
    assert caption_reward("A fork and a cup.", GT, cfg, TRUTH) == pytest.approx(1.0)


def test_weight_zero_is_todays_reward():
    off = RewardConfig()
    assert score(CAPTION, GT, cfg=off).components == {"caption": 0.5, "coverage": 1.0, "hallucination": 0.5}
    # the truth is ignored when the term is off
    assert score(CAPTION, GT, cfg=off, truth=TRUTH).total == score(CAPTION, GT, cfg=off).total
    assert mention_credits(["A", " blue", " fork"], GT, off, TRUTH) == [0.0, 0.0, 0.5]


def test_weight_on_without_truth_is_an_error():
    cfg = RewardConfig(attribute_weight=1.0)
    with pytest.raises(ValueError, match="colour truth"):
        score(CAPTION, GT, cfg=cfg)
    with pytest.raises(ValueError, match="colour truth"):
        mention_credits(["A", " fork"], GT, cfg)
    with pytest.raises(ValueError, match="attribute_weight must be >= 0"):
        RewardConfig(attribute_weight=-1.0)


def test_mention_credits_put_the_colour_penalty_on_the_colour_word():
    cfg = RewardConfig(hallucination_weight=3.0, attribute_weight=2.0)
    pieces = ["In", " the", " first", " photo", ",", " a", " bl", "ue", " fork", " and", " a", " blue",
              " cup", ".", " In", " the", " second", " photo", ",", " a", " red", " fork", " and", " a",
              " yellow", " dog", "."]  # fmt: skip
    assert "".join(pieces) == CAPTION
    got = mention_credits(pieces, GT, cfg, TRUTH)
    want = [0.0] * len(pieces)
    want[pieces.index(" bl")] = -1.0  # wrong colour: -2 / 2, on the word's first token
    want[pieces.index(" fork")] = 0.5  # fork covered: 1 / 2
    want[pieces.index(" cup")] = 0.5
    want[pieces.index(" red")] = -1.0
    want[pieces.index(" dog")] = -1.5  # hallucinated: -3 / 2
    assert got == pytest.approx(want)
    assert sum(got) == pytest.approx(caption_reward(CAPTION, GT, cfg, TRUTH))


def test_right_colours_earn_once_per_object_and_colour():
    cfg = RewardConfig(attribute_weight=1.0, attribute_coverage_weight=1.0)
    # red fork right (image 0 scope), blue cup right, the red fork again: a repeat earns nothing
    text = "A red fork, a blue cup and a red fork. A cyan fork."
    t = caption_terms(text, GT, vocabulary("world"), TRUTH)
    assert t["attribute_coverage"] == 1.0 and t["attribute"] == 0.5  # 2 right facts / 2; cyan wrong / 2
    assert caption_reward(text, GT, cfg, TRUTH) == pytest.approx(1.0 + 1.0 - 0.5)
    pieces = ["A", " red", " fork", ",", " a", " blue", " cup", " and", " a", " red", " fork", ".", " A",
              " cyan", " fork", "."]  # fmt: skip
    got = mention_credits(pieces, GT, cfg, TRUTH)
    want = [0.0, 0.5, 0.5, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.5, 0.0, 0.0]
    assert got == pytest.approx(want) and sum(got) == pytest.approx(caption_reward(text, GT, cfg, TRUTH))
    # coverage alone also needs the truth
    with pytest.raises(ValueError, match="colour truth"):
        score(text, GT, cfg=RewardConfig(attribute_coverage_weight=1.0))


def test_char_tokens():
    assert char_tokens(["ab", " c", "de"], [0, 1, 2, 3, 5]) == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="outside the caption"):
        char_tokens(["ab"], [2])


def test_batch_scores_with_truths():
    cfg = RewardConfig(attribute_weight=1.0)
    totals, comps = batch_scores(
        [CAPTION, "yes"], [GT, []], labels=[None, "yes"], cfg=cfg, truths=[TRUTH, None]
    )
    assert totals == pytest.approx([1.0 - 0.5 - 1.0, 1.0])
    assert (
        comps["attribute"][0] == 1.0 and comps["attribute"][1] != comps["attribute"][1]
    )  # NaN on the answer
    with pytest.raises(ValueError, match="one colour truth per text"):
        batch_scores([CAPTION], [GT], cfg=cfg, truths=[])


def test_grpo_token_credits_and_config_checks():
    from mm.data.tokenizer import load_tokenizer
    from rl.trainers.grpo import GRPOConfig, Prompt, token_credits
    from rl.trainers.grpo_files_config import FilesRewardConfig
    from tests.helpers.rollout import caption_rollout

    tok = load_tokenizer()
    caption = tok(" a blue fork and a blue cup", add_special_tokens=False)["input_ids"]
    roll = caption_rollout(caption)
    rows = [Prompt(note=0, text="Describe the note.", label=None)]
    cfg = RewardConfig(attribute_weight=2.0)
    got = token_credits(roll, rows, [GT], tok, cfg, [TRUTH])  # (1, R)
    pieces = [tok.decode([t]) for t in caption]
    assert got[0].tolist() == pytest.approx(mention_credits(pieces, GT, cfg, TRUTH))
    assert got[0].sum().item() == pytest.approx(1.0 - 1.0)  # fork, cup covered; the fork is not blue
    GRPOConfig(**{"reward": _sourced(source="labeler", attribute_weight=1.0)})  # the labeler judges colours
    with pytest.raises(ValueError, match="a reward model has no colour term"):
        GRPOConfig(**{"reward": _sourced(source="rm:/runs/rm", attribute_weight=1.0)})
    with pytest.raises(ValueError, match="needs algo.mention_credit > 0"):
        GRPOConfig(**{"algo": _algo(colour_in_sequence=False, mention_credit=0.0)})
    with pytest.raises(ValueError, match="prompt files"):
        FilesRewardConfig(attribute_weight=1.0)
    with pytest.raises(ValueError, match="reward.source scene"):
        GRPOConfig(**{"reward": _sourced(source="rm:/runs/rm", attribute_coverage_weight=1.0)})


def _algo(**kw):
    from rl.trainers.grpo_config import AlgoConfig

    return AlgoConfig(**kw)


def _sourced(**kw):
    from rl.labeler_reward import SourcedRewardConfig

    return SourcedRewardConfig(**kw)


def test_dpo_scene_scorer_ranks_by_colour():
    from rl.pairs.onpolicy import rank_pair, scene_scorer
    from rl.trainers.dpo_config import DataConfig

    texts = ["A blue fork and a blue cup.", "A red fork and a blue cup."]
    assert scene_scorer(RewardConfig())(NOTE, texts) == [1.0, 1.0]  # today: a tie, no pair
    rewards = scene_scorer(RewardConfig(attribute_weight=2.0))(NOTE, texts)
    assert rewards == pytest.approx([0.0, 1.0])
    assert rank_pair(texts, rewards) == (1, 0)
    both = scene_scorer(RewardConfig(attribute_weight=1.0, attribute_coverage_weight=1.0))(NOTE, texts)
    assert both == pytest.approx([1.0 - 0.5 + 0.5, 1.0 + 1.0])  # blue cup right in both; blue fork wrong
    with pytest.raises(ValueError, match="data.build onpolicy"):
        DataConfig(build="injection", attribute_weight=1.0)
    with pytest.raises(ValueError, match="finite numbers"):
        DataConfig(build="onpolicy", notes=10, attribute_weight=-1.0)
    with pytest.raises(ValueError, match="data.build onpolicy"):
        DataConfig(build="injection", attribute_coverage_weight=1.0)


@pytest.mark.parametrize("in_sequence", [True, False])
def test_grpo_runs_with_the_colour_terms(tmp_path, in_sequence):
    """Two GRPO steps on notes with colour truth: the colour components are logged (the fixture's objects
    have no colours, so no colour claim is judged and both stay 0)."""
    import json
    import warnings
    from pathlib import Path

    from rl.cli import main
    from tests.helpers.eval_model import make_data_dir, make_model_dir

    model, data = make_model_dir(tmp_path), make_data_dir(tmp_path, split="train")
    config = Path(__file__).resolve().parents[2] / "configs" / "rl" / "grpo_tiny.yaml"
    sets = [
        f"init.model={model}", "data.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=6",
        "train.steps=2", "data.tasks=[caption]", "algo.mention_credit=1.0", "reward.attribute_weight=1.0",
        "reward.attribute_coverage_weight=1.0", f"algo.colour_in_sequence={str(in_sequence).lower()}",
    ]  # fmt: skip
    args = ["grpo", "--config", str(config), "--out", str(tmp_path / "run"), "--data", str(data),
            "--no-progress"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args + [x for s in sets for x in ("--set", s)]) == 0
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["step"] == 2
    if in_sequence:
        assert recs[-1]["reward_attribute"] == 0.0 and recs[-1]["reward_attribute_coverage"] == 0.0
    else:  # the colours are in the per-token credit only: the caption reward has no colour component
        assert "reward_attribute" not in recs[-1] and "mention_credit_abs" in recs[-1]
