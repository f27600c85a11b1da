"""`rl distill` data parallel: 2 gloo processes == 1 process on the whole batch (weights of every step, the
logged token means, the held-out eval, the saved model), data parallel and FSDP; an answer's sampled ids do
not depend on the other prompts of its batch."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.launch import EPS, checkpoints, moved, one_and_two, records, same_records, same_weights
from tests.rl.test_distill_trainer import _cfg, world  # noqa: F401  (world: the module's fixture)

COMPARED = ("loss", "reverse_kl", "teacher_nll", "student_nll", "response_len", "student_share")
"""Logged metrics that must be the whole batch's under 2 processes."""
SETS = [
    "train.steps=2", "train.checkpoint_every=1", "train.keep_last=5", "train.eval_every=2",
    "data.batch_size=4", "data.lmbda=0.75", "data.off_policy=teacher", "data.eval_notes=3",
    "data.eval_split=train", "loss.kind=gjsd", "loss.beta=0.5", "rollout.temperature=0.7",
    "rollout.max_new_tokens=6", "optim.lr=1e-3", "train.device=cpu", "train.threads=1", EPS,
]  # fmt: skip
"""3 student rows of 4: one process samples two of them, the other one and the teacher's row."""


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True])
def test_two_processes_equal_one(world, tmp_path, fsdp):  # noqa: F811
    _, data, student, teacher = world
    args = ["distill", "--student", str(student), "--teacher", str(teacher), "--no-progress"]
    args += [x for s in [f"data.folder={data}", *SETS] for x in ("--set", s)]
    one, two, stdout = one_and_two(tmp_path, args, fsdp=fsdp)
    assert stdout.count('"teacher_family"') == 1  # rank 0 alone reports
    same_records(one, two, COMPARED, 2)
    a, b = records(one)[-1], records(two)[-1]
    assert all(a[k] == b[k] for k in ("eval/chair_i", "eval/recall", "eval/mean_length"))  # greedy captions
    first, last, _ = same_weights(one, two, [*checkpoints(2), "model/model.safetensors"])
    moved(first, last)


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


def test_seeded_answers_follow_the_tempered_softmax(world):  # noqa: F811
    """The first answer token of 600 seeded draws of one prompt at temperature 0.5 against
    softmax(logits / 0.5) of the generation prompt (the image token suppressed): total variation < 0.1."""
    from rl.trainers.distill import DistillTrainer, load_models
    from rl.trainers.distill_data import build_prompts

    cfg = _cfg(world, "rollout.temperature=0.5", "rollout.max_new_tokens=1")
    student, _ = load_models(cfg, torch.device("cpu"))
    trainer = DistillTrainer(cfg=cfg, student=student, teacher=None, prompts=build_prompts(cfg.data))
    sample = trainer.prompts.sample(0)
    ids = trainer._sample(student, [sample] * 600, list(range(600)), 0, 0)
    inputs = student.to_device(student.build_prompts([sample]))
    with torch.no_grad():
        logits = student.model(**inputs).logits[0, -1].double()  # (V,)
    logits[list(student.placeholder_ids)] = -float("inf")
    expected = torch.softmax(logits / 0.5, dim=-1)
    drawn = torch.bincount(torch.tensor([i[0] for i in ids]), minlength=expected.numel()).double() / 600
    assert 0.5 * (drawn - expected).abs().sum() < 0.1
    untempered = torch.softmax(logits, dim=-1)
    assert 0.5 * (drawn - untempered).abs().sum() > 0.2  # the check tells temperature 0.5 from 1 (0.40)
