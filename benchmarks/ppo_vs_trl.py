"""Step time of ``rl ppo``'s step against TRL's ``RLOOTrainer`` on the same tiny model, prompts and batch.

    python benchmarks/ppo_vs_trl.py      # tiny Qwen2, 16 prompts x 2 answers, 32 new tokens, 2 x 2 updates
    python benchmarks/ppo_vs_trl.py --steps 4 --rounds 3 --json out.json

TRL 1.x ships no PPO trainer (``PPOTrainer`` left the main package and ``trl.experimental`` holds none), so
the peer is its closest on-policy trainer with several updates per rollout: ``RLOOTrainer`` (REINFORCE
leave-one-out baseline, PPO's clipped ratio, ``num_iterations`` passes over each rollout in
``steps_per_generation`` minibatches). Both sides train the *same* random tiny text-only Qwen2 (saved to a
folder first) with the project tokenizer, float32 on the CPU, on the same plain-text prompts: ``--prompts``
prompts x ``--group`` sampled answers of at most ``--new-tokens`` tokens at temperature 1 (no top-k / top-p),
a length reward (words / 10, identical for both), ``--epochs`` passes of ``--minibatches`` minibatches per
rollout (one AdamW step per minibatch, gradients clipped at norm 1), clip range 0.2 / 0.28, KL weight 0
(no reference model), advantages whitened over the batch.

One *rollout step* = sample the batch with the KV cache, score it, one no-gradient forward for the old
log-probs (ours: the old values too, from the same forward), advantages, then ``epochs * minibatches``
updates (forward, loss, backward, clip, AdamW step). Ours is :class:`rl.trainers.ppo.PPOTrainer`'s
``batch`` + ``epochs * minibatches`` x (``loss`` + backward + step) with a value head on the policy
(``critic: shared``: the value loss and GAE are extra work TRL's RLOO does not do); TRL's is the sum of the
``epochs * minibatches`` optimizer steps (timed by a ``TrainerCallback``) that share one generation.

Runs ``--rounds`` alternating rounds (ours, then TRL, from the same saved weights) and prints the medians
of the rollout-step times after each round's first (warm-up) rollout step, the ratio ours / TRL (target
<= 1.0x), each round's ratio, both sides' mean sampled answer length (the same work only if they match)
and the load average. Compare ratios from one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
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


def length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """Reward = number of words / 10 (identical for TRL and ours; varies within groups)."""
    return [len(str(c).split()) / 10.0 for c in completions]


class TextPrompts:
    """Plain-text prompts with the interface :class:`rl.trainers.ppo.PPOTrainer` samples from
    (``len``, ``prompts``, ``batch(indices)`` -> left-padded ``input_ids`` / ``attention_mask``)."""

    def __init__(self, tok: Any, prompts: list[str]) -> None:
        self.tok, self.prompts = tok, prompts

    def __len__(self) -> int:
        return len(self.prompts)

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Tokenized at every step, as TRL tokenizes each generation batch's prompts."""
        rows = [self.tok(self.prompts[i], add_special_tokens=False)["input_ids"] for i in indices]
        P = max(len(r) for r in rows)
        pad = self.tok.pad_token_id
        ids = torch.tensor([[pad] * (P - len(r)) + r for r in rows])  # (n, P) left padded
        attn = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows])  # (n, P)
        return {"input_ids": ids, "attention_mask": attn}


class LengthRewarder:
    """``reward.source``-style rewarder for the trainer: :func:`length_reward` of each sampled answer."""

    def score(self, texts: list[str], rows: list[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        r = torch.tensor(length_reward(texts), dtype=torch.float32)  # (N,)
        return r, {"reward_length": float(r.mean())}


def ppo_overrides(args: argparse.Namespace) -> list[str]:
    """``rl ppo`` config overrides for the benchmark's batch (ppo.yaml's algorithm, the peer's settings)."""
    return [
        f"data.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.new_tokens}", "rollout.temperature=1.0", "rollout.top_p=1.0",
        "algo.eps_low=0.2", "algo.eps_high=0.28", "algo.beta=0.0", "algo.mention_credit=0.0",
        f"ppo.epochs={args.epochs}", f"ppo.minibatches={args.minibatches}", "optim.lr=1e-5",
        "optim.grad_clip=1.0", f"train.steps={args.steps}", "train.seed=0",
    ]  # fmt: skip


def ours(model: Any, tok: Any, prompts: list[str], args: argparse.Namespace) -> tuple[list[float], float]:
    """Rollout-step times of :class:`PPOTrainer` and the mean sampled answer length."""
    from mm.config import load_config
    from mm.train.config import build_optimizer
    from rl.trainers.common import Reference
    from rl.trainers.ppo import PPOTrainer, optimizer_groups
    from rl.trainers.ppo_config import PPOConfig
    from rl.trainers.rm_model import hidden_size
    from rl.trainers.value_head import ActorCritic, value_head

    cfg = load_config(PPOConfig, None, ppo_overrides(args))
    torch.manual_seed(0)
    ac = ActorCritic(policy=model, head=value_head(hidden_size(model)))
    trainer = PPOTrainer(
        cfg, ac, Reference(model=model, needed=False), TextPrompts(tok, prompts), tok, torch.device("cpu"),
        LengthRewarder(),
    )  # fmt: skip
    opt, _ = build_optimizer(optimizer_groups(ac, cfg), cfg.optim, cfg.train.steps)
    ac.train()
    times, lengths = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        batch = trainer.batch(step)
        for _ in range(trainer.updates_per_step):
            loss, _ = trainer.loss(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ac.parameters(), cfg.optim.grad_clip)
            opt.step()
        times.append(time.perf_counter() - t0)
        lengths.append(batch["metrics"]["response_len"])
    return times, statistics.mean(lengths)


def trl(folder: Path, tok: Any, prompts: list[str], args: argparse.Namespace) -> tuple[list[float], float]:
    """Rollout-step times of TRL's ``RLOOTrainer`` (sums of the optimizer steps sharing one generation)
    and the mean sampled answer length."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import RLOOConfig, RLOOTrainer

    updates = args.epochs * args.minibatches
    rows = args.prompts * args.group
    timer = StepTimer()
    cfg = RLOOConfig(
        **{**common_args(folder / "trl_rloo", args.steps * updates), "logging_steps": 1},
        per_device_train_batch_size=rows // args.minibatches, steps_per_generation=args.minibatches,
        num_iterations=args.epochs, num_generations=args.group, max_completion_length=args.new_tokens,
        temperature=1.0, top_k=0, top_p=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28,
        normalize_advantages=True, max_grad_norm=1.0,
    )  # fmt: skip
    trainer = RLOOTrainer(
        model=str(folder), reward_funcs=length_reward, args=cfg,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]), processing_class=tok,
        callbacks=[timer.callback],
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # logging every step (for the answer lengths), not printing
    trainer.train()
    t = timer.times
    steps = [sum(t[i : i + updates]) for i in range(0, len(t) - updates + 1, updates)]
    key = "completions/mean_length"
    lengths = [r[key] for r in trainer.state.log_history if key in r]
    return steps, statistics.mean(lengths) if lengths else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import Qwen2ForCausalLM

    rows = args.prompts * args.group
    if rows % args.minibatches or (rows // args.minibatches) % args.group:
        raise SystemExit(
            f"--prompts x --group = {rows} rows must split into --minibatches "
            f"{args.minibatches} minibatches of whole groups of {args.group} (TRL's RLOO needs it)"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    res: dict[str, Any] = {"config": vars(args), "load_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "lm"
        _, tok = make_lm(folder, hidden=args.hidden, layers=args.layers, seed=0)
        prompts = texts(args.prompts * args.steps, 8, 4)
        rounds, lens = RoundTimes(), {"ours": [], "trl": []}
        for _ in range(args.rounds):  # alternate sides so load drift on a shared machine hits both
            o, o_len = ours(Qwen2ForCausalLM.from_pretrained(str(folder)), tok, prompts, args)
            t, t_len = trl(folder, tok, prompts, args)
            rounds.add(o, t)
            lens["ours"].append(o_len)
            lens["trl"].append(t_len)
        res["ppo"] = {
            **rounds.result(1.0),
            "ours_answer_len": statistics.mean(lens["ours"]), "trl_answer_len": statistics.mean(lens["trl"]),
        }  # fmt: skip
    res["load_end"] = os.getloadavg()[0]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="rollout steps per side (first is warm-up)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per rollout step")
    ap.add_argument("--group", type=int, default=2, help="sampled answers per prompt")
    ap.add_argument("--new-tokens", type=int, default=32, help="longest sampled answer")
    ap.add_argument("--epochs", type=int, default=2, help="passes over each rollout (ppo.epochs)")
    ap.add_argument("--minibatches", type=int, default=2, help="minibatches per pass (ppo.minibatches)")
    ap.add_argument("--hidden", type=int, default=64, help="LM hidden size")
    ap.add_argument("--layers", type=int, default=2, help="LM layers")
    add_round_args(ap, threads=1)
    args = ap.parse_args(argv)
    res = run(args)
    print_ratio_table(res, ("ppo",))
    r = res["ppo"]
    lens = f"ours {r['ours_answer_len']:.1f}, TRL {r['trl_answer_len']:.1f}"
    print(f"mean sampled answer length: {lens} tokens")
    return finish(res, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
