"""`rl grpo --prompts P.jsonl --reward labeler|rm:DIR`: GRPO on a prompt file that carries no ground truth
(no ``objects``, no ``answer``). The labeler reward equals the labeler's own P(yes) and claim credits,
yes/no records are told apart from caption requests, and bad specs fail in one line before writing."""

from __future__ import annotations

import json
import math
import re
import warnings

import pytest

from rl.cli import main
from tests.mm.adapter_helpers import random_image

RECORDS = [  # no objects, no answers: what a user without annotations has
    {"id": "cap", "image": "0.png", "question": "Describe the image."},
    {"id": "q", "image": ["1.png", "2.png"], "question": "Is there a dog in the second image?"},
    {"id": "t", "image": "2.png", "question": "What is in it?", "task": "caption"},
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from tests.helpers.eval_model import make_model_dir

    root = tmp_path_factory.mktemp("grpo_nogt")
    (root / "imgs").mkdir()
    for i in range(3):
        random_image(24 + 8 * i, 16 + 8 * i, seed=i).save(root / "imgs" / f"{i}.png")
    (root / "p.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    return root, make_model_dir(root / "nv")


def _run(root, model, out, reward, *sets, prompts=None):
    args = ["grpo", "--model", str(model), "--prompts", str(prompts or root / "p.jsonl"), "--image-folder",
            str(root / "imgs"), "--reward", reward, "--out", str(out), "--no-progress"]  # fmt: skip
    base = ["train.steps=2", "train.device=cpu", "data.prompts_per_step=2", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "optim.lr=0.01"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(args + [x for s in (*base, *sets) for x in ("--set", s)])


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_is_yesno():
    from rl.trainers.grpo_files_sourced import is_yesno

    assert is_yesno({}, "Is there a dog?") and is_yesno({}, "  are there two cups")
    assert is_yesno({}, "Does it?")
    assert not is_yesno({}, "Describe the image.") and not is_yesno({}, "Island scenery: describe it.")
    assert is_yesno({"task": "yesno"}, "Describe.") and not is_yesno({"task": "caption"}, "Is it red?")
    with pytest.raises(ValueError, match="task must be 'yesno' or 'caption'"):
        is_yesno({"task": "vqa"}, "What?")


def test_two_steps_with_the_labeler_reward(tmp_path, files):
    root, model = files
    out = tmp_path / "run"
    assert _run(root, model, out, "labeler", f"reward.labeler.cache={tmp_path / 'cache'}") == 0
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert math.isfinite(r["loss"]) and 0.0 <= r["labeler_cache_hit_frac"] <= 1.0
    assert (tmp_path / "cache" / "labels.jsonl").is_file()  # the labeler was asked (and cached to disk)
    assert json.loads((out / "result.json").read_text())["step"] == 2


def test_labeler_reward_equals_the_labelers_own_answers(files):
    """Each reward is what the labeler says: a yes/no answer scores P(yes) (or 1 - P(yes)) of the same
    question about the record's images; a caption scores its claims' supports."""
    from rl.labeler import Labeler, LabelerConfig
    from rl.labeler_reward import claim_values
    from rl.rewards import vocabulary
    from rl.trainers.grpo_files_config import FilesRewardConfig
    from rl.trainers.grpo_files_data import PromptImages, read_prompts
    from rl.trainers.grpo_files_sourced import build_sourced_reward

    root, model = files
    records = read_prompts(root / "p.jsonl", root / "imgs")
    images = PromptImages(records)
    cfg = FilesRewardConfig(fn="labeler", hallucination_weight=2.0)
    reward = build_sourced_reward(cfg, records=records, images=images, policy_folder=str(model), device="cpu")
    texts = ["A dog and a cup.", "yes", "no", "A cat."]
    got, means = reward.score([0, 1, 1, 2], texts)
    lab = Labeler.from_folder(model, LabelerConfig())
    p_q = lab.p_yes([(images.sample(1).images, records[1].question)])[0]
    vocab = vocabulary("coco")
    want = []
    for i, t in ((0, texts[0]), (2, texts[3])):
        objs = [c for _, c in vocab.mentions(t)]
        support = lab.verify_objects(images.sample(i).images, objs)
        want.append(sum(claim_values(objs, support, coverage_weight=cfg.coverage_weight,
                                     hallucination_weight=2.0)))  # fmt: skip
    assert got[0].item() == pytest.approx(cfg.caption_weight * want[0], abs=1e-6)
    assert got[3].item() == pytest.approx(cfg.caption_weight * want[1], abs=1e-6)
    assert got[1].item() == pytest.approx(cfg.yesno_weight * p_q, abs=1e-6)
    assert got[2].item() == pytest.approx(cfg.yesno_weight * (1 - p_q), abs=1e-6)
    assert means["reward_yesno"] == pytest.approx((p_q + 1 - p_q) / 2, abs=1e-6)


def test_two_steps_with_a_reward_model(tmp_path, files):
    root, model = files
    pairs = [{"image": f"{i % 3}.png", "question": "Describe the image.", "chosen": c, "rejected": r}
             for i, (c, r) in enumerate([("A cup.", "A cup and a dog."), ("A fork.", "A bus."),
                                         ("A plate.", "Two plates and a car.")])]  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(p) for p in pairs) + "\n")
    rm = tmp_path / "rm"
    args = ["rm", "--model", str(model), "--pairs", str(tmp_path / "pairs.jsonl"), "--image-folder",
            str(root / "imgs"), "--out", str(rm), "--no-progress"]  # fmt: skip
    sets = ("train.steps=2", "train.eval_every=2", "data.batch_size=2", "data.heldout=0.34", "optim.lr=0.01",
            "train.checkpoint_every=2")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args + [x for s in sets for x in ("--set", s)]) == 0
    out = tmp_path / "run"
    assert _run(root, model, out, f"rm:{rm}") == 0
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2] and all(math.isfinite(r["reward_rm"]) for r in recs)


@pytest.mark.parametrize(
    ("reward", "record", "message"),
    [
        ("rm:no/such/folder", None, "reward model folder 'no/such/folder' not found"),
        ("labeler", {"image": "0.png", "question": "Describe.", "task": "vqa"}, r"p2\.jsonl:1: task must be"),
    ],
)
def test_bad_specs_fail_in_one_line_before_writing(tmp_path, files, capsys, reward, record, message):
    root, model = files
    prompts = None
    if record is not None:
        prompts = tmp_path / "p2.jsonl"
        prompts.write_text(json.dumps(record) + "\n")
    out = tmp_path / "out"
    assert _run(root, model, out, reward, prompts=prompts) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not out.exists()
