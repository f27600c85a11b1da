"""``rl distill``: on-policy distillation of a student from a teacher sharing its tokenizer, on the training
skeleton (:mod:`mm.train.loop`).

One step (Agarwal et al. 2024, "On-Policy Distillation of Language Models" (GKD), Algorithm 1, with the
share of student rows fixed per batch):

1. take ``data.batch_size`` prompts (caption requests about the world's notes, or a prompt file's records);
2. the student samples the answers of the first ``round(lmbda * batch_size)`` rows (on-policy); the other
   rows get a teacher sample (``data.off_policy: teacher``, TRL's ``seq_kd``) or the dataset answer;
3. the teacher's log-probs over the vocabulary at every answer token, once per rollout (no gradient, in
   batches of ``teacher.batch_size`` rows, cached: :class:`rl.trainers.distill_teacher.TeacherScorer`);
4. the loss (:mod:`rl.distill_losses`) on every answer token of the batch: ``reverse_kl`` (full: the exact
   ``KL(p_s || p_t)`` per token; sampled: the on-policy distillation recipe's per-token advantage
   ``-(log p_s - log p_t)`` in a policy-gradient loss) or ``gjsd`` (GKD's generalised JSD with ``beta``).

Off-policy KD in the same harness: ``loss.kind: sft_on_teacher`` makes every row a teacher sample and
trains the student's NLL on it (sequence-level KD), with the same prompts, batch and steps.

Logged per step: ``loss``, ``reverse_kl`` (exact token-mean KL(student || teacher) on the batch; not for
sft_on_teacher), ``teacher_nll`` / ``student_nll`` (mean -log p of the answer tokens), ``response_len``,
``student_share``; every ``train.eval_every`` steps with ``data.eval_notes``: ``eval/chair_i``,
``eval/recall``, ``eval/chair_s``, ``eval/mean_length`` of greedy captions of held-out notes.

Deviations from TRL's ``GKDTrainer``: the student share is ``round(lmbda * B)`` rows of every batch (TRL
draws one coin per batch); the loss temperature is ``loss.temperature`` and sampling has its own
(``rollout.temperature``); answers are sampled by the adapter's ``generate`` (a NoteVLM suppresses its
image token there, the loss does not), each prompt's from a generator of its own seeded by ``(seed, step,
student or teacher, position in the batch)`` (:mod:`rl.rollout.seeded`), so an answer does not depend on
which other prompts share its batch or its process.

Data parallel (torchrun / accelerate launch; FSDP with ``train.fsdp``): each process takes a contiguous
share of every step's batch (the student rows are the batch's first ones, wherever they fall), samples and
scores it; its loss, a token mean over its rows, is weighted by its share of the batch's answer tokens,
so the skeleton's mean of the gradients is the whole batch's token mean: N processes take one process's
steps. Only rank 0 evaluates and writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mm.config import to_dict
from mm.errors import UserError
from mm.model.adapter import load_adapter
from mm.model.adapter.batching import gather_logps
from mm.train import common, loop
from mm.train.caption_eval import caption_object_metrics
from mm.train.common import rank_world
from rl.distill_losses import (
    gjsd_loss,
    masked_mean,
    reverse_kl_advantages,
    reverse_kl_loss,
    sampled_kl_loss,
    sft_loss,
)
from rl.rollout.seeded import SeededSampler, prompt_generators, prompt_seed
from rl.trainers.common import make_optimizer, start_run, trained_adapter
from rl.trainers.distill_config import DistillConfig
from rl.trainers.distill_data import NotePrompts, build_prompts, check_answers
from rl.trainers.distill_teacher import TeacherScorer, check_same_vocab, window_logits
from rl.trainers.dpo_files import VISION_MODULES, save_model
from rl.trainers.grpo_shard import global_counts, loss_weight, shard_positions

DISTILL_PLOT_KEYS = ["loss", "reverse_kl", "teacher_nll", "student_nll", "response_len", "eval/chair_i",
                     "eval/recall"]  # fmt: skip
"""Panels of OUT/curves.png."""


def load_models(cfg: DistillConfig, device: torch.device) -> tuple[Any, Any]:
    """``(student, teacher)`` adapters: the student LoRA-wrapped or trainable but its vision tower, the
    teacher frozen; refuses models that do not share a vocabulary."""
    for role, path in (("student", cfg.student.path), ("teacher", cfg.teacher.path)):
        if not path:
            raise UserError(f"rl distill needs --{role} DIR (or {role}.path): a saved model folder")
    student = load_adapter(cfg.student.path, device=device, dtype=cfg.student.dtype)
    teacher = load_adapter(cfg.teacher.path, device=device, dtype=cfg.teacher.dtype)
    check_same_vocab(student, teacher)
    teacher.model.eval()
    for p in teacher.model.parameters():
        p.requires_grad_(False)
    if cfg.lora.enabled:
        student.apply_lora(r=cfg.lora.r, alpha=cfg.lora.alpha, dropout=cfg.lora.dropout)
    else:
        for name, p in student.model.named_parameters():
            p.requires_grad_(not any(m in name.split(".") for m in VISION_MODULES))
    return student, teacher


class DistillTrainer(loop.StepTrainer):
    """A step's batch: the rollout (student / off-policy answers) with the teacher's log-probs; its loss:
    ``loss.kind`` on every answer token."""

    progress_keys = ("reverse_kl",)

    def __init__(
        self, *, cfg: DistillConfig, student: Any, teacher: TeacherScorer, prompts: Any,
        heldout: NotePrompts | None = None,
    ) -> None:  # fmt: skip
        self.cfg, self.student, self.teacher = cfg, student, teacher
        self.prompts, self.heldout = prompts, heldout
        self.model = student.model
        lmbda = 0.0 if cfg.loss.kind == "sft_on_teacher" else cfg.data.lmbda
        self.student_rows = round(lmbda * cfg.data.batch_size)
        """Rows of every batch the student samples (the first ones)."""
        self.rank, self.world = rank_world()
        self.positions = shard_positions(cfg.data.batch_size, rank=self.rank, world=self.world)
        """This process's rows of every step's batch (a contiguous share)."""

    def _sample(
        self, adapter: Any, samples: list[Any], positions: list[int], step: int, salt: int
    ) -> list[list[int]]:
        """Answer ids sampled by ``adapter``, each from a generator seeded by ``(seed, step, salt, position)``
        (:class:`rl.rollout.seeded.SeededSampler`, after the temperature; ``generate``'s own warpers then
        see one-hot scores)."""
        from transformers import LogitsProcessorList, TemperatureLogitsWarper

        ro = self.cfg.rollout
        seeds = [prompt_seed(self.cfg.train.seed, step, salt, p) for p in positions]
        warp = [TemperatureLogitsWarper(ro.temperature)] if ro.temperature != 1.0 else []
        draw = SeededSampler(prompt_generators(seeds, adapter.device), group_size=1)
        gen = adapter.generate_ids(
            samples, max_new_tokens=ro.max_new_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=None,
            logits_processor=LogitsProcessorList([*warp, draw]),
        )  # fmt: skip
        return gen.token_ids

    def rollout(self, step: int) -> tuple[list[Any], list[list[int]]]:
        """This process's prompts of ``step`` and their answer ids (its student rows first, then its
        off-policy rows)."""
        cfg = self.cfg
        idx = common.batch_indices(len(self.prompts), cfg.data.batch_size, seed=cfg.train.seed, step=step)
        samples = [self.prompts.sample(idx[p]) for p in self.positions]
        n = sum(p < self.student_rows for p in self.positions)  # the positions are in order
        answers = self._sample(self.student, samples[:n], self.positions[:n], step, 0) if n else []
        rest = samples[n:]
        if rest and (cfg.loss.kind == "sft_on_teacher" or cfg.data.off_policy == "teacher"):
            answers += self._sample(self.teacher.adapter, rest, self.positions[n:], step, 1)
        elif rest:
            answers += [self.student.encode_answer(s.answer)[: cfg.rollout.max_new_tokens] for s in rest]
        return samples, answers

    def batch(self, step: int) -> dict[str, Any]:
        samples, answers = self.rollout(step)
        inputs = self.student.answer_batch(samples, answers)  # (b, T) + response_mask
        teacher = None
        if self.cfg.loss.kind != "sft_on_teacher":
            teacher = self.teacher.logps(("train", step), samples, answers)  # (b, A, V)
        tokens = float(inputs["response_mask"].sum())
        all_tokens, _ = global_counts((tokens, 0.0), world=self.world)
        return {
            "inputs": inputs,
            "teacher_logps": teacher,
            "response_len": sum(len(a) for a in answers) / len(answers),
            "share": loss_weight(tokens, all_tokens, world=self.world),  # 1.0 in one process
        }

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        loss_cfg, inputs = self.cfg.loss, batch["inputs"]
        logits, mask = window_logits(self.student, inputs)  # (B, W, V), (B, W)
        targets = inputs["input_ids"][:, -logits.shape[1] :]  # (B, W)
        T = loss_cfg.temperature
        logps = gather_logps(logits, targets)  # (B, W) at temperature 1
        metrics: dict[str, Any] = {
            "student_nll": float(masked_mean(-logps.detach(), mask)),
            "response_len": batch["response_len"],
            "student_share": self.student_rows / self.cfg.data.batch_size,
        }
        if loss_cfg.kind == "sft_on_teacher":
            return self._shared(sft_loss(logps, mask), metrics, batch["share"])
        teacher = batch["teacher_logps"]  # (B, W, V)
        if teacher.shape != logits.shape:
            raise RuntimeError(f"teacher log-probs {tuple(teacher.shape)} do not line up with the student's "
                               f"answer window {tuple(logits.shape)}")  # fmt: skip
        if loss_cfg.kind == "gjsd":
            loss = gjsd_loss(logits, teacher, mask, beta=loss_cfg.beta, temperature=T)
        elif loss_cfg.estimator == "full":
            loss = reverse_kl_loss(logits, teacher, mask, temperature=T)
        else:
            student_t = gather_logps(logits, targets, temperature=T)  # (B, W)
            teacher_t = gather_logps(teacher, targets, temperature=T)  # (B, W)
            loss = sampled_kl_loss(student_t, reverse_kl_advantages(student_t, teacher_t, mask), mask)
        with torch.no_grad():
            metrics["reverse_kl"] = float(reverse_kl_loss(logits.detach(), teacher, mask, temperature=T))
            metrics["teacher_nll"] = float(masked_mean(-gather_logps(teacher, targets), mask))
        return self._shared(loss, metrics, batch["share"])

    def _shared(
        self, loss: torch.Tensor, metrics: dict[str, Any], share: float
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """This process's part of the batch's token means (the loss and the ``*_nll`` / ``reverse_kl``
        metrics), so their mean over processes is the whole batch's. The row means (``response_len``) need
        none: every process holds as many rows."""
        if self.world == 1:
            return loss, metrics
        rows = ("response_len", "student_share")
        return loss * share, {k: v if k in rows else v * share for k, v in metrics.items()}

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """CHAIR_i, recall, CHAIR_s and mean length of greedy captions of the held-out notes."""
        if self.heldout is None:
            return {}
        student = trained_adapter(self.student, self.model)  # under FSDP: the gathered copy (rank 0)
        return caption_metrics(student, self.heldout, batch_size=self.cfg.data.batch_size,
                               max_new_tokens=self.cfg.rollout.max_new_tokens)  # fmt: skip


def caption_metrics(
    adapter: Any, notes: NotePrompts, *, batch_size: int, max_new_tokens: int
) -> dict[str, Any]:
    """Greedy captions of every note of ``notes`` by ``adapter``, scored by
    :func:`mm.train.caption_eval.caption_object_metrics` (CHAIR_i, recall, CHAIR_s, mean length)."""
    captions: list[str] = []
    for i in range(0, len(notes), batch_size):
        samples = [notes.sample(j) for j in range(i, min(i + batch_size, len(notes)))]
        captions += adapter.generate(samples, max_new_tokens=max_new_tokens)
    m = caption_object_metrics(captions, notes.objects)
    return {k: m[k] for k in ("chair_i", "recall", "chair_s", "mean_length")} | {"_captions": captions}


def train(
    cfg: DistillConfig,
    *,
    out_dir: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Distil ``cfg.teacher`` into ``cfg.student``; writes OUT/metrics.jsonl, OUT/curves.png,
    OUT/checkpoints/, OUT/model (+ OUT/adapter under LoRA). Returns a summary."""
    prompts = build_prompts(cfg.data)
    off_rows = cfg.loss.kind != "sft_on_teacher" and cfg.data.lmbda < 1
    check_answers(prompts, cfg.data, needs_dataset=off_rows and cfg.data.off_policy == "dataset")
    heldout = None
    if cfg.data.eval_notes:
        heldout = NotePrompts(folder=cfg.data.folder, split=cfg.data.eval_split, notes=cfg.data.eval_notes,
                              prompt=cfg.data.caption_prompt)  # fmt: skip
    out, device = start_run(cfg.train, out_dir, global_batch=cfg.data.batch_size)
    student, teacher = load_models(cfg, device)
    scorer = TeacherScorer(teacher, batch_size=cfg.teacher.batch_size)
    trainer = DistillTrainer(cfg=cfg, student=student, teacher=scorer, prompts=prompts, heldout=heldout)
    opt, sched = make_optimizer(student.model, cfg.optim, cfg.train.steps)
    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=cfg.train, out=out, config=to_dict(cfg),
        desc=f"distill-{cfg.loss.kind}", plot_keys=DISTILL_PLOT_KEYS,
        eval_every=cfg.train.eval_every if heldout is not None else None, grad_clip=cfg.optim.grad_clip,
        resume=resume, show_progress=show_progress, stop_after=stop_after,
    )  # fmt: skip
    if not result.stopped:  # rank 0 writes OUT; every rank returns once it is there
        common.on_rank0(lambda: save_model(trained_adapter(student, result.model), out))
    return {
        "step": result.step,
        "loss": cfg.loss.kind,
        "student_family": student.family,
        "teacher_family": teacher.family,
        "prompts": len(prompts),
        "student_rows_per_batch": trainer.student_rows,
        "teacher_forwards": scorer.forwards,
        "heldout": {k: v for k, v in result.metrics.items() if k[0] != "_"},
        "train_seconds": round(result.seconds, 3),
        "step_seconds": round(result.step_seconds, 4),
        "last": result.last,
    }
