"""Step time of ``rl distill``'s step against TRL's ``GKDTrainer`` on the same tiny models and batch.

    python benchmarks/distill_vs_trl.py            # tiny Qwen2 student / teacher, batch 8, 32 new tokens
    python benchmarks/distill_vs_trl.py --steps 6 --rounds 3 --json out.json

TRL's ``GKDTrainer`` trains text-only causal LMs, so both sides distil the *same* random tiny Qwen2 teacher
(``--teacher-hidden``) into the same student (``--hidden``), both with the project tokenizer, on the same
chat prompts: fully on-policy (``lmbda`` 1), generalised JSD with ``beta`` 0.5 at temperature 1, ``--batch``
prompts per step, ``--new-tokens`` sampled tokens at most, AdamW at a constant rate, CPU, float32. One
step = sample the batch with the student (KV cache), teacher forward (no gradient), student forward, loss,
backward, optimizer step. TRL is timed per optimizer step by a ``TrainerCallback``; ours is
:class:`rl.trainers.distill.DistillTrainer`'s ``batch`` + ``loss`` + backward + step, with the models
behind a small text-only adapter (the VLM adapter's interface with the tokenizer's chat template).

Runs ``--rounds`` alternating rounds (ours, then TRL, from the same saved weights) and prints the
medians of all step times after each round's first (warm-up) step, the ratio ours / TRL (target
<= 1.0x) and each round's ratio. Compare ratios from one run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import types
import warnings
from pathlib import Path
from typing import Any

import torch
from rl_bench import (  # beside this script
    RoundTimes,
    StepTimer,
    add_round_args,
    common_args,
    finish,
    make_lm,
    print_ratio_table,
    texts,
)

from mm.model.adapter import Sample, VLMAdapter


class TextAdapter(VLMAdapter):
    """A text-only causal LM behind the adapter interface: the user turn through the chat template."""

    family = "text"

    def build_prompts(self, samples: Any) -> dict[str, Any]:
        tok = self.tokenizer
        rows = [
            tok(tok.apply_chat_template([{"role": "user", "content": s.text}], add_generation_prompt=True,
                                        tokenize=False), add_special_tokens=False)["input_ids"]
            for s in samples
        ]  # fmt: skip
        P = max(len(r) for r in rows)
        ids = torch.tensor([[tok.pad_token_id] * (P - len(r)) + r for r in rows])  # (B, P) left padded
        attn = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows])  # (B, P)
        return self.to_device({"input_ids": ids, "attention_mask": attn})

    def lora_config(self, **kwargs: Any) -> Any:
        raise NotImplementedError("the benchmark trains all weights")


class Prompts:
    """Chat prompts with answers; the images are placeholders the text adapter ignores."""

    def __init__(self, prompts: list[str], answers: list[str]) -> None:
        self.prompts, self.answers = prompts, answers

    def __len__(self) -> int:
        return len(self.prompts)

    def sample(self, i: int) -> Sample:
        return Sample(images=[None], text=self.prompts[i], answer=self.answers[i])


def ours(
    student: Any, teacher: Any, tok: Any, data: Prompts, *, batch: int, new: int, steps: int
) -> list[float]:
    from mm.config import load_config
    from rl.trainers.common import make_optimizer
    from rl.trainers.distill import DistillTrainer
    from rl.trainers.distill_config import DistillConfig
    from rl.trainers.distill_teacher import TeacherScorer

    sets = ["loss.kind=gjsd", "loss.beta=0.5", "data.lmbda=1", f"data.batch_size={batch}",
            f"rollout.max_new_tokens={new}", "optim.lr=1e-5", f"train.steps={steps}"]  # fmt: skip
    cfg = load_config(DistillConfig, None, sets)
    processor = types.SimpleNamespace(tokenizer=tok)
    s, t = TextAdapter(model=student, processor=processor), TextAdapter(model=teacher, processor=processor)
    trainer = DistillTrainer(cfg=cfg, student=s, teacher=TeacherScorer(t, batch_size=batch), prompts=data)
    opt, _ = make_optimizer(student, cfg.optim, steps)
    student.train()
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        loss, _ = trainer.loss(trainer.batch(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def trl(student_dir: Path, teacher_dir: Path, tok: Any, data: Prompts, *, batch: int, new: int, steps: int):
    from datasets import Dataset

    try:
        from trl.experimental.gkd import GKDConfig, GKDTrainer
    except ImportError:
        from trl import GKDConfig, GKDTrainer  # older TRL: the trainer was in the main package

    rows = [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}]}
            for p, a in zip(data.prompts, data.answers)]  # fmt: skip
    timer = StepTimer()
    args = GKDConfig(
        **common_args(student_dir.parent / "trl_gkd", steps), per_device_train_batch_size=batch, lmbda=1.0,
        beta=0.5, temperature=1.0, max_new_tokens=new, seq_kd=False,
    )  # fmt: skip
    trainer = GKDTrainer(
        model=str(student_dir), teacher_model=str(teacher_dir), args=args,
        train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[timer.callback],
    )  # fmt: skip
    trainer.train()
    return timer.times


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import Qwen2ForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    res: dict[str, Any] = {"config": vars(args), "load_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        sdir, tdir = Path(tmp) / "student", Path(tmp) / "teacher"
        _, tok = make_lm(sdir, hidden=args.hidden, layers=args.layers, seed=0)
        make_lm(tdir, hidden=args.teacher_hidden, layers=args.teacher_layers, seed=1)
        n = args.batch * args.steps
        data = Prompts(texts(n, 8, 4), texts(n, 16, 5))
        kw = dict(batch=args.batch, new=args.new_tokens, steps=args.steps)
        rounds = RoundTimes()
        for _ in range(args.rounds):  # alternate sides so load drift on a shared machine hits both
            teacher = Qwen2ForCausalLM.from_pretrained(str(tdir)).eval()
            o = ours(Qwen2ForCausalLM.from_pretrained(str(sdir)), teacher, tok, data, **kw)
            rounds.add(o, trl(sdir, tdir, tok, data, **kw))
        res["gkd"] = rounds.result(1.0)
    res["load_end"] = os.getloadavg()[0]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per side (first is warm-up)")
    ap.add_argument("--batch", type=int, default=8, help="prompts per step")
    ap.add_argument("--new-tokens", type=int, default=32, help="longest sampled answer")
    ap.add_argument("--hidden", type=int, default=64, help="student hidden size")
    ap.add_argument("--layers", type=int, default=2, help="student layers")
    ap.add_argument("--teacher-hidden", type=int, default=128, help="teacher hidden size")
    ap.add_argument("--teacher-layers", type=int, default=4, help="teacher layers")
    add_round_args(ap, threads=1)
    args = ap.parse_args(argv)
    res = run(args)
    print_ratio_table(res, ("gkd",))
    return finish(res, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
