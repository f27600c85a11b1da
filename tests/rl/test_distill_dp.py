"""`rl distill` data parallel: 2 gloo processes == 1 process on the whole batch (weights of every step, the
logged token means, the held-out eval, the saved model), data parallel and FSDP; an answer's sampled ids do
not depend on the other prompts of its batch."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from rl.cli import main
from tests.rl.test_distill_trainer import _cfg, world  # noqa: F401  (world: the module's fixture)
from tests.rl.test_grpo_dp import EPS, _launch

COMPARED = ("loss", "reverse_kl", "teacher_nll", "student_nll", "response_len", "student_share")
"""Logged metrics that must be the whole batch's under 2 processes."""
SETS = [
    "train.steps=2", "train.checkpoint_every=1", "train.keep_last=5", "train.eval_every=2",
    "data.batch_size=4", "data.lmbda=0.75", "data.off_policy=teacher", "data.eval_notes=3",
    "data.eval_split=train", "loss.kind=gjsd", "loss.beta=0.5", "rollout.temperature=0.7",
    "rollout.max_new_tokens=6", "optim.lr=1e-3", "train.device=cpu", "train.threads=1", EPS,
]  # fmt: skip
"""3 student rows of 4: one process samples two of them, the other one and the teacher's row."""


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("fsdp", [False, True])
def test_two_processes_equal_one(world, tmp_path, fsdp):  # noqa: F811
    from safetensors.torch import load_file

    _, data, student, teacher = world
    args = ["distill", "--student", str(student), "--teacher", str(teacher), "--no-progress"]
    args += [x for s in [f"data.folder={data}", *SETS] for x in ("--set", s)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*args, "--out", str(tmp_path / "one")]) == 0
    work = tmp_path / "work"
    work.mkdir()
    fsdp_args = ["--set", "train.fsdp=true"] if fsdp else []
    proc = _launch(work, "torchrun", *args, *fsdp_args, "--out", str(work / "two"))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.stdout.count('"teacher_family"') == 1  # rank 0 alone reports
    one, two = tmp_path / "one", work / "two"
    ra, rb = _records(one), _records(two)
    assert [r["step"] for r in rb] == [r["step"] for r in ra] == [1, 2]
    for a, b in zip(ra, rb):
        assert set(a) - {"time_s", "cpu_s", "step_s"} == set(b) - {"time_s", "cpu_s", "step_s"}
        for k in COMPARED:
            assert b[k] == pytest.approx(a[k], abs=1e-5), (a["step"], k, a[k], b[k])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    for k in ("eval/chair_i", "eval/recall", "eval/mean_length"):  # greedy captions of the same weights
        assert rb[-1][k] == ra[-1][k]
    names = [f"checkpoints/step-{s:08d}/model.safetensors" for s in (1, 2)] + ["model/model.safetensors"]
    for name in names:
        wa, wb = load_file(str(one / name)), load_file(str(two / name))
        assert wa.keys() == wb.keys()
        assert max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa) < 1e-5, name
    first, last = (load_file(str(one / n)) for n in names[:2])
    assert max((first[k] - last[k]).abs().max().item() for k in first) > 1e-4  # the steps moved the weights


def test_an_answer_does_not_depend_on_its_batch(world):  # noqa: F811
    """The same prompt at the same batch position draws the same ids alone or beside others."""
    from rl.trainers.distill import DistillTrainer, load_models
    from rl.trainers.distill_data import build_prompts

    cfg = _cfg(world, "rollout.temperature=0.7")
    student, _ = load_models(cfg, torch.device("cpu"))
    trainer = DistillTrainer(cfg=cfg, student=student, teacher=None, prompts=build_prompts(cfg.data))
    samples = [trainer.prompts.sample(i) for i in range(len(trainer.prompts))]
    together = trainer._sample(student, samples, list(range(len(samples))), 5, 0)
    alone = [trainer._sample(student, [s], [p], 5, 0)[0] for p, s in enumerate(samples)]
    assert together == alone and len({tuple(a) for a in alone}) > 1
