"""`rl rm`: the Bradley-Terry loss (golden, float64), 3 training steps with held-out accuracy, the saved
reward model's scores, and `rl grpo` with `reward.source: rm:DIR`."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from rl.cli import main
from rl.trainers.rm_model import bt_loss, last_token_index
from tests.helpers.eval_model import make_data_dir, make_model_dir

CHOICES = [
    ("A fork and a cup.", "A dog and a knife."),
    ("A dog.", "A cat and a horse."),
    ("A plate and a knife.", "A plate, a knife and a train."),
    ("A cup.", "Two cups and a bird."),
    ("A fork.", "A bus."),
    ("A knife and a dog.", "A knife, a dog and a car."),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    data = make_data_dir(root, split="train")
    images = ["images/n0_0.png", "images/n1_0.png", "images/n1_1.png"]
    lines = [
        json.dumps({"id": f"p{i}", "image": images[i % 3], "question": "Describe the note.", "chosen": c,
                    "rejected": r})
        for i, (c, r) in enumerate(CHOICES)
    ]  # fmt: skip
    (data / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    return make_model_dir(root), data


def test_bt_loss_golden_float64():
    c = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    j = torch.tensor([0.0, 2.0, 0.5], dtype=torch.float64)
    # -(log sigmoid(1) + log sigmoid(-2) + log sigmoid(0)) / 3
    want = (0.31326168751822286 + 2.1269280110429727 + 0.6931471805599453) / 3
    assert bt_loss(c, j).item() == pytest.approx(want, abs=1e-15)
    assert bt_loss(c, j, center_weight=0.5).item() == pytest.approx(want + 0.5 * (1 + 4 + 1) / 3, abs=1e-15)
    with pytest.raises(ValueError, match=r"\(B,\) chosen and rejected"):
        bt_loss(c, j[:2])


def test_last_token_index_left_and_right_padding():
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0]])
    assert last_token_index(mask).tolist() == [3, 4, 2]


def _rm(world, out, *sets):
    model, data = world
    args = ["rm", "--model", str(model), "--pairs", str(data / "pairs.jsonl"), "--out", str(out),
            "--no-progress"]  # fmt: skip
    base = ("train.steps=3", "train.eval_every=3", "data.batch_size=2", "data.heldout=0.34", "optim.lr=0.01",
            "train.checkpoint_every=3")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(args + [x for s in (*base, *sets) for x in ("--set", s)])


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("rm_out") / "rm"
    assert _rm(world, out) == 0
    return out


def test_rm_three_steps_and_heldout_accuracy(world, trained):
    from mm.model.adapter import Sample
    from rl.pairs.importers import open_images, read_pair_file
    from rl.trainers.rm import split_pairs
    from rl.trainers.rm_model import load_reward_model

    recs = [json.loads(x) for x in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2, 3]
    for k in ("loss", "accuracy", "margin", "reward_chosen", "reward_rejected", "grad_norm"):
        assert math.isfinite(recs[-1][k]), k
    assert recs[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # zero-initialised head: r = 0
    res = json.loads((trained / "result.json").read_text())
    assert res["pairs"] == 4 and res["heldout_pairs"] == 2 and res["heldout"]["pairs"] == 2
    acc = recs[-1]["eval/accuracy"]
    assert acc == res["heldout"]["accuracy"] and acc in (0.0, 0.5, 1.0)
    for f in ("model/config.json", "value_head.pt", "reward_model.json", "adapter/adapter_config.json"):
        assert (trained / f).is_file(), f
    # the saved reward model gives the held-out accuracy the trainer logged
    pairs, _ = read_pair_file(world[1] / "pairs.jsonl", world[1])
    _, held = split_pairs(pairs, 0.34, seed=0)
    rm = load_reward_model(trained)
    samples = [Sample(images=open_images(p), text=p.question) for p in held]
    c = rm.score(samples, [p.chosen for p in held])
    j = rm.score(samples, [p.rejected for p in held])
    assert sum(a > b for a, b in zip(c, j)) / len(held) == acc
    assert any(abs(v) > 0 for v in c + j)  # the head moved off zero


def test_rm_bad_inputs(tmp_path, world):
    assert _rm(world, tmp_path / "bad", "data.heldout=0.99") == 2
    assert main(["rm", "--pairs", str(world[1] / "pairs.jsonl"), "--out", str(tmp_path / "x")]) == 2


def test_grpo_two_steps_with_the_reward_model(tmp_path, world, trained):
    model, data = world
    config = Path(__file__).resolve().parents[2] / "configs" / "rl" / "grpo_tiny.yaml"
    sets = [f"init.model={model}", "data.prompts_per_step=2", "rollout.group_size=3",
            "rollout.max_new_tokens=6", "train.steps=2", "train.checkpoint_every=2", "optim.lr=0.01",
            f"reward.source=rm:{trained}"]  # fmt: skip
    out = tmp_path / "grpo"
    args = ["grpo", "--config", str(config), "--out", str(out), "--data", str(data), "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args + [x for s in sets for x in ("--set", s)]) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]
    assert all(math.isfinite(r["reward_rm"]) and math.isfinite(r["loss"]) for r in recs)
    assert recs[0]["reward_std"] > 0  # the reward model tells the sampled responses apart
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = main(args + [x for s in (*sets, "algo.mention_credit=1") for x in ("--set", s)])
    assert bad == 2


def test_rm_on_a_transformers_family_full_fine_tuning(tmp_path):
    from tests.mm.adapter_helpers import build_family, random_image

    folder = build_family("qwen2_vl", tmp_path / "qwen2_vl")
    for i in range(3):
        random_image(28, 28, seed=i).save(tmp_path / f"im{i}.png")
    lines = [json.dumps({"image": f"im{i % 3}.png", "question": "What is it?", "chosen": c, "rejected": r})
             for i, (c, r) in enumerate(CHOICES)]  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "rm"
    args = ["rm", "--model", str(folder), "--pairs", str(tmp_path / "pairs.jsonl"), "--out", str(out),
            "--no-progress"]  # fmt: skip
    sets = ("train.steps=2", "data.batch_size=2", "data.heldout=0.2", "lora.enabled=false", "optim.lr=0.01")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args + [x for s in sets for x in ("--set", s)]) == 0
    res = json.loads((out / "result.json").read_text())
    assert res["family"] == "qwen2_vl" and res["heldout"]["pairs"] == 1
    assert (out / "model" / "config.json").is_file() and not (out / "adapter").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True])
def test_two_processes_equal_one(world, tmp_path, fsdp):
    """torchrun, 2 ranks x 1 pair == 1 process x 2 pairs, data parallel and FSDP: the weights of every step,
    the held-out evaluation (rank 0, on the gathered weights under FSDP), the saved model and value head."""
    from safetensors.torch import load_file

    from tests.helpers.launch import launch

    model, data = world
    sets = ["train.steps=3", "train.eval_every=3", "data.batch_size=2", "data.heldout=0.34", "optim.lr=0.01",
            "train.checkpoint_every=1", "train.keep_last=5", "train.device=cpu",
            "train.threads=1"]  # fmt: skip
    args = ["rm", "--model", str(model), "--pairs", str(data / "pairs.jsonl"), "--no-progress"]
    args += [x for s in sets for x in ("--set", s)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*args, "--out", str(tmp_path / "one")]) == 0
    work = tmp_path / "work"
    work.mkdir()
    proc = launch(work, "torchrun", *args, *(["--set", "train.fsdp=true"] if fsdp else []), "--out",
                   str(work / "two"))  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    one, two = tmp_path / "one", work / "two"
    ra = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rb] == [r["step"] for r in ra] == [1, 2, 3]
    for a, b in zip(ra, rb):
        for k in ("loss", "accuracy", "margin", "reward_chosen", "reward_rejected"):
            assert b[k] == pytest.approx(a[k], abs=1e-5), (a["step"], k)
    assert rb[-1]["eval/accuracy"] == ra[-1]["eval/accuracy"]
    assert rb[-1]["eval/loss"] == pytest.approx(ra[-1]["eval/loss"], abs=1e-5)
    names = [f"checkpoints/step-{s:08d}/model.safetensors" for s in (1, 2, 3)] + ["model/model.safetensors"]
    for name in names:
        wa, wb = load_file(str(one / name)), load_file(str(two / name))
        assert wa.keys() == wb.keys() and max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5, name
    head_a, head_b = torch.load(one / "value_head.pt"), torch.load(two / "value_head.pt")
    assert all(torch.allclose(head_a[k], head_b[k], atol=1e-5) for k in head_a)
    assert float(head_b["weight"].abs().sum()) > 0  # the head trained from its zero init
    assert float(head_a["bias"]) == float(head_b["bias"]) == 0.0  # no BT gradient: frozen, not float noise
