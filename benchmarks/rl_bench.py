"""Step time of ``rl``'s DPO and GRPO steps against TRL's ``DPOTrainer`` / ``GRPOTrainer``; rollout tokens/s.

    python benchmarks/rl_bench.py                      # tiny Qwen2, batch 8 pairs / 4 prompts x 8, 6 steps
    python benchmarks/rl_bench.py --steps 4 --hidden 64 --json out.json

TRL cannot drive NoteVLM (see rl/trainers/dpo.py and grpo.py), so both sides train the *same* tiny
text-only Qwen2 causal LM (random init, saved to a folder first so TRL can rebuild its reference from
``config._name_or_path``) with the project tokenizer, on the same prompts/answers and batch sizes:

- DPO: ``sigmoid`` loss, beta 0.1, frozen-copy reference, AdamW; one optimizer step = forward of
  chosen + rejected (policy and reference), backward, step. TRL: ``DPOTrainer`` (``use_cpu=True,
  bf16=False``), timed per optimizer step by a ``TrainerCallback`` (``on_step_begin`` -> ``on_step_end``).
- GRPO: ``group_size`` sampled completions per prompt with the KV cache (same max length and
  temperature), a length reward (a real but cheap reward, identical for both), group advantages,
  clipped loss, ``beta=0`` (no reference, TRL's default), one update per generation batch.

Runs ``--rounds`` alternating rounds (ours, then TRL, each from the same saved weights) so load drift
on a shared machine hits both sides; prints the medians of all step times after each round's first
(warm-up) step, their ratio ours / TRL (targets: DPO <= 1.0x, GRPO <= 0.5x), each round's ratio, our
rollout tokens/s (generated tokens / generation time) next to HF ``generate``'s on the same prompt batches
(the reference for ``rl.trainers.rollout``'s decode loop; same tokens for the same seed), and the load
average.
Compare ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

WORDS = (
    "a fork a knife a cup a plate a dog a cat on the table in the kitchen next to it there is also".split()
)


def make_lm(folder: Path, *, hidden: int, layers: int, seed: int = 0) -> tuple[Any, Any]:
    """A random tiny Qwen2 LM + the project tokenizer, saved to ``folder``; returns (model, tokenizer)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mm.data.tokenizer import load_tokenizer

    tok = load_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return model, tok


def texts(n: int, words: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [
        " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (words,), generator=g)) for _ in range(n)
    ]


def pair_data(n: int) -> list[dict[str, str]]:
    p, c, r = texts(n, 12, 1), texts(n, 24, 2), texts(n, 24, 3)
    return [{"prompt": a, "chosen": b, "rejected": x} for a, b, x in zip(p, c, r)]


class StepTimer:
    """A transformers TrainerCallback recording each optimizer step's wall time."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        timer = self
        self.times: list[float] = []

        class CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                timer._t = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                timer.times.append(time.perf_counter() - timer._t)

        self.callback = CB()


def common_args(out: Path, steps: int) -> dict[str, Any]:
    return dict(
        output_dir=str(out), use_cpu=True, bf16=False, max_steps=steps, report_to=[], save_strategy="no",
        logging_steps=10_000, learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0,
        gradient_accumulation_steps=1, dataloader_num_workers=0, disable_tqdm=True, seed=0,
    )  # fmt: skip


# ---------------------------------------------------------------- DPO


def trl_dpo(folder: Path, tok: Any, pairs: list[dict], *, batch: int, steps: int) -> list[float]:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    timer = StepTimer()
    args = DPOConfig(
        **common_args(folder / "trl_dpo", steps), per_device_train_batch_size=batch, beta=0.1,
        loss_type=["sigmoid"], max_length=None,
    )  # fmt: skip
    trainer = DPOTrainer(
        model=str(folder), args=args, train_dataset=Dataset.from_list(pairs), processing_class=tok,
        callbacks=[timer.callback],
    )  # fmt: skip
    trainer.train()
    return timer.times


def ours_dpo(model: Any, tok: Any, pairs: list[dict], *, batch: int, steps: int) -> list[float]:
    from rl.trainers.common import Reference
    from rl.trainers.dpo import LossConfig, dpo_step

    def row(prompt: str, answer: str) -> tuple[list[int], list[int]]:
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        a = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return p + a, [0] * len(p) + [1] * len(a)

    def make_batch(items: list[dict]) -> dict[str, Any]:
        rows = [row(x["prompt"], x["chosen"]) for x in items] + [
            row(x["prompt"], x["rejected"]) for x in items
        ]
        T = max(len(r[0]) for r in rows)
        ids = torch.full((len(rows), T), tok.pad_token_id)
        attn, resp = torch.zeros_like(ids), torch.zeros_like(ids)
        for i, (r, m) in enumerate(rows):
            ids[i, : len(r)], attn[i, : len(r)], resp[i, : len(r)] = torch.tensor(r), 1, torch.tensor(m)
        return {"input_ids": ids, "attention_mask": attn, "response_mask": resp, "num_pairs": len(items)}

    model.train()
    ref = Reference(model=model, needed=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    cfg = LossConfig(loss_type="sigmoid", beta=0.1)
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        b = make_batch([pairs[(s * batch + i) % len(pairs)] for i in range(batch)])
        loss, _ = dpo_step(model, ref, b, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------- GRPO


def length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """Reward = number of words / 10 (identical for TRL and ours; non-constant within groups)."""
    return [len(str(c).split()) / 10.0 for c in completions]


def trl_grpo(folder: Path, tok: Any, prompts: list[str], *, n_prompts: int, group: int, new: int, steps: int):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    timer = StepTimer()
    args = GRPOConfig(
        **common_args(folder / "trl_grpo", steps), per_device_train_batch_size=n_prompts * group,
        num_generations=group, max_completion_length=new, temperature=1.0, top_k=0, beta=0.0,
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, scale_rewards="group",
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=str(folder), reward_funcs=length_reward, args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]), processing_class=tok,
        callbacks=[timer.callback],
    )  # fmt: skip
    trainer.train()
    return timer.times


def prompt_batch(
    tok: Any, prompts: list[str], step: int, n_prompts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded ``(input_ids, attention_mask)``, each ``(n, P)``, of step ``step``'s prompts."""
    chunk = [prompts[(step * n_prompts + i) % len(prompts)] for i in range(n_prompts)]
    enc = [tok(p, add_special_tokens=False)["input_ids"] for p in chunk]
    P = max(len(e) for e in enc)
    ids = torch.tensor([[tok.pad_token_id] * (P - len(e)) + e for e in enc])
    attn = torch.tensor([[0] * (P - len(e)) + [1] * len(e) for e in enc])
    return ids, attn


def hf_generate_tps(
    model: Any, tok: Any, prompts: list[str], *, n_prompts: int, group: int, new: int, steps: int
):
    """Tokens/s of HF ``generate`` on the batches ``ours_grpo`` samples (the rollout's reference)."""
    from rl.trainers.rollout import response_mask_from_ids

    model.eval()
    tokens, seconds = 0, 0.0
    for s in range(steps):
        ids, attn = prompt_batch(tok, prompts, s, n_prompts)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=attn, do_sample=True, top_k=0, num_return_sequences=group,
                max_new_tokens=new, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            )  # fmt: skip
        seconds += time.perf_counter() - t0
        tokens += int(response_mask_from_ids(out[:, ids.shape[1] :], tok.eos_token_id)[0].sum())
    return tokens / max(seconds, 1e-9)


def ours_grpo(model: Any, tok: Any, prompts: list[str], *, n_prompts: int, group: int, new: int, steps: int):
    from rl.advantages import group_advantages
    from rl.trainers.grpo import AlgoConfig, grpo_loss
    from rl.trainers.rollout import generate_rollout

    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    algo = AlgoConfig(eps_low=0.2, eps_high=0.28, agg="token-mean", beta=0.0)
    times, gen_tokens, gen_seconds = [], 0, 0.0
    for s in range(steps):
        t0 = time.perf_counter()
        ids, attn = prompt_batch(tok, prompts, s, n_prompts)
        tg = time.perf_counter()
        roll = generate_rollout(
            model, {"input_ids": ids, "attention_mask": attn}, group_size=group, max_new_tokens=new,
            eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
        )  # fmt: skip
        gen_seconds += time.perf_counter() - tg
        gen_tokens += int(roll.lengths.sum())
        rewards = torch.tensor(
            length_reward([tok.decode(r, skip_special_tokens=True) for r in roll.response_ids()])
        )
        adv = group_advantages(rewards, group_size=group, scale="group")
        loss, _ = grpo_loss(model, roll.batch(), adv, algo, horizon=new)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times, gen_tokens / max(gen_seconds, 1e-9)


# ---------------------------------------------------------------- main


def median_after_warmup(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


class RoundTimes:
    """Step times of ours and TRL over alternating rounds: each run's warm-up step dropped, one ratio of the
    medians per round, and the result row every ``*_vs_trl`` benchmark reports (:meth:`result`)."""

    def __init__(self) -> None:
        self.ours: list[float] = []
        self.trl: list[float] = []
        self.ratios: list[float] = []

    def add(self, ours: list[float], trl: list[float]) -> None:
        """One round's per-step times of each side."""
        self.ours += ours[1:] if len(ours) > 1 else ours
        self.trl += trl[1:] if len(trl) > 1 else trl
        self.ratios.append(median_after_warmup(ours) / median_after_warmup(trl))

    def result(self, target: float = 1.0) -> dict[str, Any]:
        """``ours_s`` / ``trl_s`` (medians over every round's steps), their ``ratio``, ``round_ratios``."""
        o, t = statistics.median(self.ours), statistics.median(self.trl)
        return {"ours_s": o, "trl_s": t, "ratio": o / t, "round_ratios": self.ratios, "target": target}


def add_round_args(ap: argparse.ArgumentParser, *, threads: int) -> None:
    """``--rounds``, ``--threads`` (default ``threads``) and ``--json`` of the ``*_vs_trl`` scripts."""
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of ours then TRL")
    ap.add_argument("--threads", type=int, default=threads, help="torch threads (0 = default)")
    ap.add_argument("--json", default=None, help="also write the results here")


def print_ratio_table(res: dict[str, Any], names: tuple[str, ...]) -> None:
    """One row per benchmark in ``names`` that ``res`` holds: median step times, ratio against the target,
    per-round ratios (the table every ``*_vs_trl`` benchmark prints)."""
    print(f"{'bench':<6} {'ours s/step':>12} {'TRL s/step':>12} {'ratio':>7} {'target':>7}  per-round ratios")
    for name in names:
        if name in res:
            r = res[name]
            ok = "ok" if r["ratio"] <= r["target"] else "MISS"
            times = f"{r['ours_s']:>12.4f} {r['trl_s']:>12.4f}"
            rounds = " ".join(f"{x:.2f}" for x in r["round_ratios"])
            print(f"{name:<6} {times} {r['ratio']:>6.2f}x {r['target']:>6.1f}x {ok:<4}  {rounds}")


def finish(res: dict[str, Any], json_path: str | None) -> int:
    """Print the load averages, write ``res`` to ``json_path`` when given; the exit status."""
    print(f"load average (1 min) at start / end: {res['load_start']:.1f} / {res['load_end']:.1f}")
    if json_path:
        Path(json_path).write_text(json.dumps(res, indent=1))
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    import os

    from transformers import Qwen2ForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    res: dict[str, Any] = {"config": vars(args), "load_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "lm"
        _, tok = make_lm(folder, hidden=args.hidden, layers=args.layers)
        fresh = lambda: Qwen2ForCausalLM.from_pretrained(str(folder))  # noqa: E731 (same weights each time)
        pairs = pair_data(args.pairs * args.steps)
        prompts = texts(args.prompts * args.steps, 8, 4)
        kw = dict(n_prompts=args.prompts, group=args.group, new=args.new_tokens, steps=args.steps)
        sides = {
            "dpo": (
                lambda: ours_dpo(fresh(), tok, pairs, batch=args.pairs, steps=args.steps),
                lambda: trl_dpo(folder, tok, pairs, batch=args.pairs, steps=args.steps),
                1.0,
            ),
            "grpo": (
                lambda: ours_grpo(fresh(), tok, prompts, **kw),
                lambda: trl_grpo(folder, tok, prompts, **kw),
                0.5,
            ),
        }
        tps: list[float] = []
        hf_tps: list[float] = []
        for name in args.only:
            ours_fn, trl_fn, target = sides[name]
            rounds = RoundTimes()
            for _ in range(args.rounds):  # alternate sides so load drift on a shared machine hits both
                o = ours_fn()
                if name == "grpo":
                    o, rate = o
                    tps.append(rate)
                    hf_tps.append(hf_generate_tps(fresh(), tok, prompts, **kw))
                rounds.add(o, trl_fn())
            res[name] = {**rounds.result(target), "median_round_ratio": statistics.median(rounds.ratios)}
        if tps:
            res["rollout_tokens_per_s"] = statistics.median(tps)
            res["hf_generate_tokens_per_s"] = statistics.median(hf_tps)
    res["load_end"] = os.getloadavg()[0]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per side (first is warm-up)")
    ap.add_argument("--pairs", type=int, default=8, help="DPO pairs per step")
    ap.add_argument("--prompts", type=int, default=4, help="GRPO prompts per step")
    ap.add_argument("--group", type=int, default=8, help="GRPO completions per prompt")
    ap.add_argument("--new-tokens", type=int, default=32, help="GRPO max completion length")
    ap.add_argument("--hidden", type=int, default=128, help="LM hidden size")
    ap.add_argument("--layers", type=int, default=2, help="LM layers")
    ap.add_argument(
        "--only", nargs="+", default=["dpo", "grpo"], choices=["dpo", "grpo"], help="which benchmarks"
    )
    add_round_args(ap, threads=0)
    args = ap.parse_args(argv)
    res = run(args)
    print_ratio_table(res, ("dpo", "grpo"))
    if "rollout_tokens_per_s" in res:
        tps = res["rollout_tokens_per_s"]
        hf = res["hf_generate_tokens_per_s"]
        print(
            f"rollout tokens/s ({args.prompts}x{args.group} per batch): ours {tps:.0f}, HF generate {hf:.0f}"
        )
    return finish(res, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
