"""`rl dpo`: two-step smoke runs (full + LoRA, mDPO terms), resume equality, metric keys, config errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl.cli import main  # noqa: E402
from tests.helpers.eval_model import make_data_dir, make_model_dir  # noqa: E402

DPO_KEYS = (
    "loss", "grad_norm", "lr", "reward_mean", "reward_std", "reward_margin", "reward_accuracy", "kl",
    "entropy", "response_len", "logp_chosen", "logp_rejected",
)  # fmt: skip
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rl" / "dpo_tiny.yaml"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo")
    return make_model_dir(root), make_data_dir(root, split="train")


def _run(dirs, out, *sets):
    model, data = dirs
    base = [f"init.model={model}", "data.batch_size=2", "train.steps=2", "train.checkpoint_every=1"]
    args = ["dpo", "--config", str(CONFIG), "--out", str(out), "--data", str(data), "--no-progress"]
    return main(args + [x for s in (*base, *sets) for x in ("--set", s)])


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("extra", [(), ("lora.enabled=true", "lora.r=2")])
def test_two_steps_full_and_lora(tmp_path, dirs, extra):
    out = tmp_path / "run"
    assert _run(dirs, out, *extra) == 0
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2]
    for k in DPO_KEYS:
        assert k in recs[-1] and recs[-1][k] == recs[-1][k], k
    # step 1: policy == reference, so the implicit rewards and the KL are 0 and loss = log 2
    assert abs(recs[0]["reward_margin"]) < 1e-5 and abs(recs[0]["loss"] - 0.6931471805599453) < 1e-5
    assert abs(recs[0]["kl"]) < 1e-5 and abs(recs[1]["reward_margin"]) > 1e-5
    assert (out / "curves.png").stat().st_size > 1000
    assert (out / "model" / "config.json").is_file() and (out / "model" / "note_processor.json").is_file()
    res = json.loads((out / "result.json").read_text())
    assert res["reference"] == ("adapter" if extra else "copy")
    if extra:
        assert (out / "adapter" / "adapter_config.json").is_file()
    from mm.model import NoteVLMForConditionalGeneration

    a = NoteVLMForConditionalGeneration.from_pretrained(str(dirs[0]))
    b = NoteVLMForConditionalGeneration.from_pretrained(str(out / "model"))
    assert not any("lora" in n for n, _ in b.named_parameters())
    moved = [n for (n, p), q in zip(a.named_parameters(), b.parameters()) if not torch.equal(p, q)]
    assert moved and not any(n.startswith("vision_tower") for n in moved)


def test_mdpo_terms_and_corrupt_pairs(tmp_path, dirs):
    out = tmp_path / "mdpo"
    sets = (
        "loss.conditional_weight=1.0",
        "loss.anchor_weight=1.0",
        "loss.corruption=blank",
        "data.build=corrupt",
    )
    assert _run(dirs, out, *sets) == 0
    r = _records(out)[0]
    # conditional term at step 1: log pi - log pi_ref is 0 on both rows -> -log s(0) = log 2
    assert abs(r["conditional_loss"] - 0.6931471805599453) < 1e-5
    assert abs(r["anchor_loss"] - 0.6931471805599453) < 1e-5
    assert abs(r["loss"] - 3 * 0.6931471805599453) < 1e-5


def test_question_pairs_join_the_caption_pairs(tmp_path, dirs):
    out = tmp_path / "q"
    assert _run(dirs, out, "data.question_ratio=0.5") == 0
    kinds = json.loads((out / "result.json").read_text())["pair_kinds"]
    assert kinds["question"] == round(0.5 * kinds["injection"]) and kinds["injection"] > 0
    assert _run(dirs, tmp_path / "bad", "data.answer_style=sentence") == 2  # a clear config error


def test_question_pairs_in_a_batch_of_their_own(tmp_path, dirs):
    from rl.trainers.dpo import QUESTION_METRICS

    out = tmp_path / "qb"
    assert _run(dirs, out, "data.question_batch_size=3") == 0
    result = json.loads((out / "result.json").read_text())
    assert set(result["pair_kinds"]) == {"injection"} and result["question_pairs"] > 3
    first, second = _records(out)
    for k in QUESTION_METRICS:
        assert f"question/{k}" in first, k
    # step 1: policy == reference, so each of the two DPO losses is log 2 and the step's loss their sum
    assert abs(first["question/dpo_loss"] - 0.6931471805599453) < 1e-5
    assert abs(first["loss"] - 2 * 0.6931471805599453) < 1e-5
    assert abs(second["question/reward_margin"]) > 1e-6  # the yes/no pairs moved the policy too
    assert _run(dirs, tmp_path / "bad", "data.question_batch_size=-1") == 2  # a clear config error


def test_correction_pairs_from_the_policy(tmp_path, dirs, monkeypatch):
    import mm.eval.generate as gen
    from mm.data.format import read_notes
    from mm.world.vocab import CATEGORY_NAMES

    notes = read_notes(dirs[1])
    absent = next(c for c in CATEGORY_NAMES if all(c not in n.categories for n in notes))
    monkeypatch.setattr(
        gen,
        "generate_captions",
        lambda m, p, ns, *a, **k: [f"It shows a {sorted(n.categories)[0]} and a red {absent}." for n in ns],
    )
    from rl.trainers import dpo

    with pytest.raises(ValueError, match="set data.notes"):
        dpo.DataConfig(build="correction")
    out = tmp_path / "c"
    assert _run(dirs, out, "data.build=correction", "data.notes=3", "data.question_ratio=1") == 0
    kinds = json.loads((out / "result.json").read_text())["pair_kinds"]
    assert kinds["correction"] >= 1 and kinds["question"] == kinds["correction"]


def test_onpolicy_pairs_from_the_policy(tmp_path, dirs):
    from rl.trainers import dpo

    with pytest.raises(ValueError, match="set data.notes"):
        dpo.DataConfig(build="onpolicy")
    with pytest.raises(ValueError, match="data.samples >= 2"):
        dpo.DataConfig(build="onpolicy", notes=3, samples=1)
    out = tmp_path / "o"
    sets = ["data.build=onpolicy", "data.notes=3", "data.samples=6", "data.temperature=1.5"]
    assert _run(dirs, out, *sets) == 0
    result = json.loads((out / "result.json").read_text())
    assert set(result["pair_kinds"]) == {"onpolicy"} and 1 <= result["pair_kinds"]["onpolicy"] <= 3


def test_onpolicy_ranking_reward_takes_the_hallucination_weight(monkeypatch, dirs):
    import rl.pairs
    from rl.trainers import dpo

    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="data.hallucination_weight"):
            dpo.DataConfig(build="onpolicy", notes=3, hallucination_weight=bad)
    seen = {}

    def fake(*args, reward_cfg=None, **kwargs):
        seen["cfg"] = reward_cfg
        return []

    monkeypatch.setattr(rl.pairs, "onpolicy_pairs", fake)
    cfg = dpo.DataConfig(folder=str(dirs[1]), build="onpolicy", notes=3, hallucination_weight=3.0)
    with pytest.raises(Exception, match="no preference pairs"):
        dpo.load_pairs(cfg, seed=0, policy=(None, None))
    assert seen["cfg"].hallucination_weight == 3.0 and seen["cfg"].coverage_weight == 1.0


def test_resume_gives_the_same_weights(tmp_path, dirs):
    from safetensors.torch import load_file

    from mm.config import load_config
    from rl.trainers import dpo

    sets = ["train.steps=3", "lora.enabled=true", "lora.r=2", "optim.lr=0.01"]
    assert _run(dirs, tmp_path / "straight", *sets) == 0
    model, data = dirs
    cfg = load_config(
        dpo.DPOConfig, CONFIG,
        [f"init.model={model}", f"data.folder={data}", "data.batch_size=2", "train.checkpoint_every=1"]
        + sets,
    )  # fmt: skip
    dpo.train(cfg, out_dir=tmp_path / "killed", show_progress=False, stop_after=1)
    assert _run(dirs, tmp_path / "killed", *sets) == 0
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "step-00000003" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "checkpoints" / "step-00000003" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in _records(tmp_path / "straight")] == [
        r["loss"] for r in _records(tmp_path / "killed")
    ]


@pytest.mark.parametrize(
    "override, message",
    [
        ("loss.beta=0", "loss.beta must be > 0"),
        ("loss.loss_type=dpo", "loss.loss_type must be one of"),
        ("train.stpes=3", "unknown key"),
        ("init.model=/nonexistent", "is not a saved NoteVLM"),
    ],
)
def test_config_errors_exit_2_with_one_line(tmp_path, dirs, capsys, override, message):
    assert _run(dirs, tmp_path / "out", override) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "out" / "model").exists()


def _torchrun(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 -m rl ...``: two CPU processes over gloo."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(port), "-m", "rl", *args,
    ]  # fmt: skip
    return subprocess.run(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )


def test_two_processes_train_data_parallel_equal_to_one(tmp_path, dirs):
    """2 ranks x 2 pairs (+ 1 yes/no pair each) == 1 process x 4 pairs (+ 2), weights and losses."""
    from safetensors.torch import load_file

    model, data = dirs
    sets = [
        f"init.model={model}", "data.batch_size=4", "data.question_batch_size=2", "train.steps=2",
        "train.checkpoint_every=1", "train.device=cpu", "train.threads=1", "optim.lr=0.01",
    ]  # fmt: skip
    args = ["dpo", "--config", str(CONFIG), "--data", str(data), "--no-progress"]
    args += [x for s in sets for x in ("--set", s)]
    ref = tmp_path / "one"
    threads = torch.get_num_threads()
    try:
        assert main([*args, "--out", str(ref)]) == 0
    finally:
        torch.set_num_threads(threads)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "two"
    proc = _torchrun(work, *args, "--out", str(out))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.stdout.count('"pair_kinds"') == 1  # rank 0 alone reports
    assert sorted(p.name for p in work.iterdir()) == ["two"]
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoints", "config.yaml", "curves.png", "metrics.jsonl", "model", "result.json",
    ]  # fmt: skip
    two, one = _records(out), _records(ref)
    assert [r["step"] for r in two] == [1, 2]  # one record per step: only rank 0 logs
    for a, b in zip(two, one):
        for k in ("loss", "reward_margin", "question/dpo_loss", "kl"):
            assert a[k] == pytest.approx(b[k], abs=1e-5), (a["step"], k)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for step in (1, 2):
        name = f"step-{step:08d}/model.safetensors"
        wa, wb = load_file(str(out / "checkpoints" / name)), load_file(str(ref / "checkpoints" / name))
        assert wa.keys() == wb.keys()
        # Adam moves a weight by about lr * g / (|g| + eps): where g is near eps (1e-8) float noise in the
        # all-reduced gradient shows in the step, so the weights agree to 1% of the step (lr 0.01), not 1e-5
        assert max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa) < 1e-4
    start = load_file(
        str(model / "model.safetensors")
    )  # the steps moved the weights: the check means something
    assert any(not torch.equal(start[k], wa[k]) for k in start if k in wa)


def test_batch_that_does_not_split_over_the_processes_is_refused(tmp_path, dirs, monkeypatch):
    from mm.config import load_config
    from mm.errors import UserError
    from rl.trainers import dpo

    model, data = dirs
    sets = [f"init.model={model}", f"data.folder={data}", "data.batch_size=3", "train.device=cpu"]
    cfg = load_config(dpo.DPOConfig, CONFIG, sets)
    monkeypatch.setattr("mm.train.common.init_distributed", lambda: (0, 2))  # as rank 0 of 2
    with pytest.raises(UserError, match="global batch of 3 must be divisible by 2 processes"):
        dpo.train(cfg, out_dir=tmp_path / "o", show_progress=False)
    assert not (tmp_path / "o").exists()


def test_colour_correction_pairs_alone_and_beside_a_build(tmp_path, dirs, monkeypatch):
    import mm.eval.generate as gen

    # the tiny model's word vocabulary spells these back, so the policy's colour probabilities are read
    monkeypatch.setattr(
        gen, "generate_captions", lambda m, p, ns, *a, **k: ["a red cup a blue fork"] * len(ns)
    )
    sure = ("data.colour_corrections=true", "data.colour_judge=self", "data.colour_threshold=0.99")
    out = tmp_path / "alone"
    assert _run(dirs, out, "data.build=none", "data.notes=2", "data.colour_keep_pairs=true", *sure) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["pair_kinds"] == {"colourfix": 2}  # one cut pair per note; no colour left to keep
    out = tmp_path / "beside"
    assert _run(dirs, out, "data.notes=2", *sure) == 0
    kinds = json.loads((out / "result.json").read_text())["pair_kinds"]
    assert kinds["colourfix"] == 2 and kinds["injection"] > 0
    assert _run(dirs, tmp_path / "bad", "data.build=none") == 2  # nothing to train on: a clear error
