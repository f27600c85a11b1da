"""The labeler: P(yes) equals a manual forward, the disk cache, claim credits, the labeler reward in
`rl grpo`, precision/recall against ground truth."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mm.errors import UserError
from mm.model.adapter import Sample
from rl.labeler import LabelCache, Labeler, LabelerConfig, model_fingerprint, question_key
from rl.labeler_reward import SourcedRewardConfig, caption_claims, claim_values
from rl.rewards import caption_reward, vocabulary
from tests.helpers.eval_model import make_data_dir, make_model_dir
from tests.mm.adapter_helpers import build_family, random_image


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("labeler")
    return make_model_dir(root), make_data_dir(root, split="train")


def _manual_p_yes(adapter, sample, yes_id, no_id) -> float:
    """One unpadded sample, full logits, last column, softmax over the two answer tokens (float64)."""
    batch = adapter.build_prompts([sample])
    inputs = {k: v for k, v in batch.items() if k not in ("response_mask", "labels")}
    with torch.no_grad():
        logits = adapter.model(**inputs, use_cache=False).logits[0, -1].double()  # (V,)
    ly, ln = logits[yes_id].item(), logits[no_id].item()
    return math.exp(ly) / (math.exp(ly) + math.exp(ln))


@pytest.mark.parametrize("family", ["notevlm", "qwen2_vl", "llava"])
def test_p_yes_equals_a_manual_forward(tmp_path, world, family):
    folder = world[0] if family == "notevlm" else build_family(family, tmp_path / family)
    lab = Labeler.from_folder(folder, LabelerConfig(batch_size=3))
    imgs = [random_image(24, 20, seed=1), random_image(30, 18, seed=2)]
    objs = ["cup", "traffic light", "wine glass", "dog"]  # questions of different lengths: left padding
    qs = [([imgs[i % 2]], lab.question(o)) for i, o in enumerate(objs)]
    got = lab.p_yes(qs)
    for (im, q), p in zip(qs, got):
        want = _manual_p_yes(lab.adapter, Sample(images=im, text=q), lab.yes_id, lab.no_id)
        assert p == pytest.approx(want, abs=1e-6)
        assert 0.0 < p < 1.0


def test_cache_hits_misses_and_disk(tmp_path, world):
    cfg = LabelerConfig(cache=str(tmp_path / "cache"))
    lab = Labeler.from_folder(world[0], cfg)
    img = random_image(16, 16, seed=3)
    first = lab.verify_objects([img], ["cup", "fork", "cup"])
    assert (lab.cache.hits, lab.cache.misses) == (0, 2)  # a repeated claim is asked once
    again = lab.verify_objects([img], ["fork", "cup"])
    assert again == first and (lab.cache.hits, lab.cache.misses) == (2, 2)
    lines = (tmp_path / "cache" / "labels.jsonl").read_text().splitlines()
    assert len(lines) == 2
    reloaded = Labeler.from_folder(world[0], cfg)  # a new process reads the file: no forward at all
    reloaded.forward_p_yes = None  # type: ignore[assignment]
    assert reloaded.verify_objects([img], ["cup", "fork"]) == first
    # another image, question or model id is another key
    other = random_image(16, 16, seed=4)
    base = question_key("m", "q", [img])
    assert len({base, question_key("m", "q", [other]), question_key("m", "q2", [img]),
                question_key("m2", "q", [img])}) == 4  # fmt: skip
    assert question_key("m", "q", [img.copy()]) == base  # content, not object identity
    assert model_fingerprint(world[0]) == model_fingerprint(world[0])


def test_bad_cache_file_and_config_errors(tmp_path):
    (tmp_path / "labels.jsonl").write_text("not json\n")
    with pytest.raises(UserError, match=r"labels.jsonl:1: not a labeler cache record"):
        LabelCache(tmp_path)
    with pytest.raises(ValueError, match=r"\{object\}"):
        LabelerConfig(question="Is it there?")
    with pytest.raises(ValueError, match="reward.source must be"):
        SourcedRewardConfig(source="oracle")


def test_same_first_token_for_yes_and_no_is_an_error(world):
    with pytest.raises(UserError, match="distinct first tokens"):
        Labeler.from_folder(world[0], LabelerConfig(yes="no", no="no"))


def test_oracle_claim_reward_is_the_scene_reward_times_g():
    vocab = vocabulary("world")
    gt = ["fork", "cup", "plate"]
    text = "A fork, a knife and a cup. Another knife, and a fork."
    objs = [c for _, c in vocab.mentions(text)]
    assert caption_claims(text, vocab) == ["fork", "knife", "cup"]
    support = {c: float(c in gt) for c in objs}
    got = sum(claim_values(objs, support, coverage_weight=1.0, hallucination_weight=2.0))
    from rl.rewards import RewardConfig

    want = caption_reward(text, gt, RewardConfig(hallucination_weight=2.0)) * len(gt)
    assert got == pytest.approx(want) and got == pytest.approx(2.0 - 2 * 2.0)
    # soft support: a first mention earns s - (1 - s), a repeat only the penalty
    assert claim_values(["cup", "cup"], {"cup": 0.75}, coverage_weight=1.0, hallucination_weight=1.0) == [
        pytest.approx(0.5), pytest.approx(-0.25)
    ]  # fmt: skip


def test_precision_recall_against_ground_truth(world):
    from rl.labeler_eval import agreement, labeler_agreement

    m = agreement([0.9, 0.8, 0.2, 0.6, 0.1], [True, False, True, False, False], threshold=0.5)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (1, 2, 1, 1)
    assert m["precision"] == pytest.approx(1 / 3) and m["recall"] == pytest.approx(0.5)
    assert m["accuracy"] == pytest.approx(0.4)
    from mm.data.format import read_notes

    notes = read_notes(world[1], split="train")
    lab = Labeler.from_folder(world[0], LabelerConfig())
    res = labeler_agreement(lab, notes, world[1], vocab="world", negatives=2, seed=0)
    assert res["questions"] == res["positives"] + res["negatives"]
    assert res["positives"] == 5 and res["negatives"] == 4  # 2 + 3 objects, 2 absent ones per note
    assert 0.0 <= res["recall"] <= 1.0


# ---------------------------------------------------------------- rl grpo with reward.source: labeler

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rl" / "grpo_tiny.yaml"


def _grpo(world, out, *sets):
    import warnings

    from rl.cli import main

    model, data = world
    base = [
        f"init.model={model}", "data.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=6",
        "train.steps=2", "train.checkpoint_every=2", "optim.lr=0.01",
    ]  # fmt: skip
    args = ["grpo", "--config", str(CONFIG), "--out", str(out), "--data", str(data), "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(args + [x for s in (*base, *sets) for x in ("--set", s)])


def test_grpo_two_steps_with_the_labeler_reward(tmp_path, world):
    out = tmp_path / "run"
    sets = ("reward.source=labeler", f"reward.labeler.cache={tmp_path / 'cache'}", "algo.mention_credit=1.0",
            "algo.overlong_penalty=true", "algo.overlong_cache=6", "data.tasks=[caption,pope_question]",
            "data.questions_per_note=1")  # fmt: skip
    assert _grpo(world, out, *sets) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert math.isfinite(r["loss"]) and r["mention_credit_abs"] >= 0
        assert 0.0 <= r["labeler_cache_hit_frac"] <= 1.0 and 0.0 <= r["reward_yesno"] <= 1.0
    assert (tmp_path / "cache" / "labels.jsonl").is_file()  # the question rows asked the labeler
    assert (out / "model" / "config.json").is_file()


def test_labeler_credits_sum_to_the_claim_reward(world):
    from mm.data.format import read_notes
    from mm.model import NoteProcessor
    from rl.labeler_reward import LabelerReward
    from rl.trainers.grpo_config import DataConfig
    from rl.trainers.grpo_data import Prompt, PromptSet
    from tests.helpers.rollout import caption_rollout

    model, data = world
    processor = NoteProcessor.from_pretrained(model)
    notes = read_notes(data, split="train")
    prompts = PromptSet(processor=processor, notes=notes, root=data, cfg=DataConfig())
    cfg = SourcedRewardConfig(source="labeler", hallucination_weight=2.0)
    rew = LabelerReward(labeler=Labeler.from_folder(model, cfg.labeler), prompts=prompts, root=data, cfg=cfg)
    from mm.data.tokenizer import load_tokenizer

    tok = load_tokenizer()  # the shipped BPE: token texts keep their spaces
    caption = tok(" a fork and a knife, and a fork", add_special_tokens=False)["input_ids"]
    roll = caption_rollout([*caption, tok.eos_token_id])
    rows = [Prompt(note=0, text="Describe the note.", label=None)]
    credits = rew.credits(roll, rows, tok)  # (1, R)
    text = tok.decode(caption, skip_special_tokens=True).strip()
    total, comps = rew.score([text], rows)
    assert credits.sum().item() == pytest.approx(total.item(), abs=1e-6)
    assert (credits != 0).sum().item() == 3 and comps["reward_claims"] == 2.0  # fork, knife, fork


# ---------------------------------------------------------------- on-policy DPO pairs ranked by the labeler


def test_onpolicy_pairs_rank_by_a_scorer_and_the_labeler_scorer(world):
    from mm.data.format import read_notes
    from mm.model import NoteProcessor, NoteVLMForConditionalGeneration
    from rl.pairs.onpolicy import labeler_scorer, onpolicy_pairs
    from rl.trainers.dpo_config import DataConfig

    model, data = world
    notes = read_notes(data, split="train")
    lab = Labeler.from_folder(model, LabelerConfig())
    texts = ["A fork and a dog.", "A cup, a cup.", "Nothing here."]
    got = labeler_scorer(lab, data)(notes[0], texts)
    from PIL import Image

    images = [Image.open(data / im).convert("RGB") for im in notes[0].images]
    p = lab.verify_objects(images, ["fork", "dog", "cup"])
    assert got[0] == pytest.approx((2 * p["fork"] - 1) + (2 * p["dog"] - 1))
    assert got[1] == pytest.approx((2 * p["cup"] - 1) - (1 - p["cup"])) and got[2] == 0.0
    policy = NoteVLMForConditionalGeneration.from_pretrained(str(model))
    proc = NoteProcessor.from_pretrained(model)
    pairs = onpolicy_pairs(policy, proc, notes, data, prompt="describe", num_samples=4, max_new_tokens=6,
                           seed=0, scorer=lambda note, ts: [float(len(t)) for t in ts])  # fmt: skip
    assert pairs and all(len(x.chosen) > len(x.rejected) and x.objects == [] for x in pairs)
    with pytest.raises(ValueError, match="data.labeler"):
        DataConfig(scorer="labeler")


def test_labeler_eval_command_prints_precision_and_recall(world, capsys):
    from rl.labeler_eval import main

    model, data = world
    assert main(["--labeler", str(model), "--data", str(data), "--split", "train", "--negatives", "1"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["questions"] == 7 and res["positives"] == 5
    assert res["tp"] + res["fn"] == 5 and res["fp"] + res["tn"] == 2
    assert main(["--labeler", str(data), "--data", str(data)]) == 2  # not a model folder


# ---------------------------------------------------------------- colour claims verified by the labeler


def test_oracle_colour_values_are_the_scene_colour_terms_times_g():
    from mm.data.format import Note, ObjectAnnotation
    from mm.eval.claims.truth import note_truth
    from rl.labeler_reward import colour_claims, colour_values
    from rl.rewards import caption_terms

    note = Note(id="n", images=["a.png"], text="", objects=[[
        ObjectAnnotation("fork", (0, 0, 4, 4), "red"), ObjectAnnotation("cup", (4, 4, 8, 8), "blue"),
        ObjectAnnotation("cup", (8, 8, 12, 12), "green")]])  # fmt: skip
    vocab = vocabulary("world")
    text = "A red fork, two cups (blue and red), a yellow dog and a red fork."
    claims = colour_claims(text, "world")
    want = [("fork", "red"), ("cup", "blue"), ("cup", "red"), ("dog", "yellow"), ("fork", "red")]
    assert [(o, c) for _, o, c in claims] == want
    assert all(text[at:].startswith(c) for at, _, c in claims)
    truth = note_truth(note, vocab)
    objects = {o for im in truth.images for o in im}
    support = {o: float(o in objects) for o in ("fork", "cup", "dog")}
    colour_support = {(o, c): float(o in objects and c in truth.images[0][o].colors) for _, o, c in claims}
    values = colour_values([(o, c) for _, o, c in claims], support, colour_support, attribute_weight=2.0,
                           attribute_coverage_weight=1.0)  # fmt: skip
    assert values == [1.0, 1.0, -2.0, 0.0, 0.0]  # right, right, wrong (no red cup), absent dog, repeat
    t = caption_terms(text, ["fork", "cup"], vocab, truth)
    assert sum(values) == pytest.approx((t["attribute_coverage"] - 2.0 * t["attribute"]) * 2)  # g = 2
    # soft: the object's support scales its colour's credit
    assert colour_values([("cup", "red")], {"cup": 0.5}, {("cup", "red"): 0.25}, attribute_weight=1.0,
                         attribute_coverage_weight=1.0) == [pytest.approx(0.5 * (0.25 - 0.75))]  # fmt: skip


def test_labeler_colour_credits_land_on_colour_words_and_sum_to_the_reward(world):
    from mm.data.format import read_notes
    from mm.data.tokenizer import load_tokenizer
    from mm.model import NoteProcessor
    from rl.labeler_reward import LabelerReward
    from rl.trainers.grpo_config import DataConfig
    from rl.trainers.grpo_data import Prompt, PromptSet
    from tests.helpers.rollout import caption_rollout

    model, data = world
    processor = NoteProcessor.from_pretrained(model)
    prompts = PromptSet(
        processor=processor, notes=read_notes(data, split="train"), root=data, cfg=DataConfig()
    )
    cfg = SourcedRewardConfig(source="labeler", attribute_weight=1.0, attribute_coverage_weight=1.0)
    lab = Labeler.from_folder(model, cfg.labeler)
    rew = LabelerReward(labeler=lab, prompts=prompts, root=data, cfg=cfg)
    tok = load_tokenizer()
    caption = tok(" a red fork and a blue cup", add_special_tokens=False)["input_ids"]
    roll = caption_rollout([*caption, tok.eos_token_id])
    rows = [Prompt(note=0, text="Describe the note.", label=None)]
    credits = rew.credits(roll, rows, tok)[0]  # (R,)
    text = tok.decode(caption, skip_special_tokens=True).strip()
    total, comps = rew.score([text], rows)
    assert credits.sum().item() == pytest.approx(total.item(), abs=1e-6)
    pieces = [tok.decode([t]) for t in caption]
    p = lab.verify_objects(rew.images(rows[0]), ["fork", "cup", "red fork", "blue cup"])
    colour = {"red": p["fork"] * (2 * p["red fork"] - 1), "blue": p["cup"] * (2 * p["blue cup"] - 1)}
    for word, want in colour.items():
        at = next(i for i, x in enumerate(pieces) if x.strip() == word)
        assert credits[at].item() == pytest.approx(want, abs=1e-6)
    assert comps["reward_colour"] == pytest.approx(sum(colour.values()), abs=1e-6)
    # in the credit only: the sequence reward drops the colour terms, the credits keep them
    only = LabelerReward(labeler=lab, prompts=prompts, root=data, cfg=cfg, colour_in_sequence=False)
    total_only, _ = only.score([text], rows)
    assert total_only.item() == pytest.approx(total.item() - sum(colour.values()), abs=1e-6)


def test_labeler_scorer_ranks_by_colours_too(world):
    from PIL import Image

    from mm.data.format import read_notes
    from rl.pairs.onpolicy import labeler_scorer
    from rl.rewards import RewardConfig

    model, data = world
    note = read_notes(data, split="train")[0]
    lab = Labeler.from_folder(model, LabelerConfig())
    cfg = RewardConfig(attribute_weight=1.0, attribute_coverage_weight=0.0)
    got = labeler_scorer(lab, data, cfg)(note, ["A red fork.", "A fork."])
    images = [Image.open(data / im).convert("RGB") for im in note.images]
    p = lab.verify_objects(images, ["fork", "red fork"])
    assert got[1] == pytest.approx(2 * p["fork"] - 1)
    assert got[0] == pytest.approx(got[1] - p["fork"] * (1 - p["red fork"]))


def test_colour_terms_need_a_judge():
    from dataclasses import replace

    from rl.trainers.dpo_config import DataConfig as DPOData
    from rl.trainers.grpo_config import GRPOConfig

    base = GRPOConfig()
    for source, gt in (("labeler", False), ("labeler", True), ("scene", True)):
        reward = SourcedRewardConfig(source=source, attribute_weight=1.0)
        replace(base, reward=reward, data=replace(base.data, ground_truth=gt))
    for source, gt in (("scene", False), ("rm:/x", True)):
        with pytest.raises(ValueError, match="a reward model has no colour term"):
            reward = SourcedRewardConfig(source=source, attribute_weight=1.0)
            replace(base, reward=reward, data=replace(base.data, ground_truth=gt))
    DPOData(
        build="onpolicy", notes=4, scorer="labeler", labeler="m", ground_truth=False, attribute_weight=1.0
    )
    with pytest.raises(ValueError, match="need data.build onpolicy"):
        DPOData(build="injection", attribute_weight=1.0)


def test_colour_agreement_asks_a_colour_it_has_and_one_another_object_has(tmp_path, world):
    import cv2
    import numpy as np

    from mm.data.format import Note, ObjectAnnotation, write_notes
    from rl.labeler_eval import colour_agreement, main

    d = tmp_path / "notes"
    (d / "images").mkdir(parents=True)
    cv2.imwrite(str(d / "images" / "a.png"), np.zeros((16, 16, 3), np.uint8))
    objs = [ObjectAnnotation("fork", (0, 0, 4, 4), "red"), ObjectAnnotation("cup", (4, 4, 8, 8), "blue"),
            ObjectAnnotation("dog", (8, 8, 12, 12), None)]  # fmt: skip
    write_notes([Note(id="n", images=["images/a.png"], text="", split="test", objects=[objs])], d)
    lab = Labeler.from_folder(world[0], LabelerConfig())
    asked = []
    real = lab.p_yes
    lab.p_yes = lambda qs, objects=None: asked.extend(objects) or real(qs, objects)
    res = colour_agreement(lab, [Note(id="n", images=["images/a.png"], text="", objects=[objs])], d)
    # the dog's colour is unknown: not asked; cup: blue (yes), red (no); fork: red (yes), blue (no)
    assert asked == ["blue cup", "red cup", "red fork", "blue fork"]
    assert (res["questions"], res["positives"], res["negatives"]) == (4, 2, 2)
    assert main(["--labeler", str(world[0]), "--data", str(d), "--claims", "colour"]) == 0
