"""``rl pairs``: build preference pairs from a note folder and a model, write them as JSONL.

    rl pairs --model runs/sft/model --data runs/data/world --kind injection --out pairs.jsonl
    rl pairs --model runs/sft/model --data runs/data/world --kind onpolicy --samples 4 --out pairs.jsonl
    rl pairs --model runs/sft/model --data runs/data/world --kind corrupt --corruption crop --out pairs.jsonl

Every pair gets the policy's mean log-prob per token of its chosen and rejected side (how on-policy it
is). The builders live in :mod:`rl.pairs`; this module only parses, loads and writes.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from mm.data.format import read_notes
from mm.errors import UserError
from rl.pairs.record import PAIR_KINDS


@dataclass(frozen=True, kw_only=True)
class PairsConfig:
    """What ``rl pairs`` builds."""

    kind: str
    """``injection``, ``onpolicy`` or ``corrupt``."""
    split: str = "train"
    """Note split the pairs come from."""
    notes: int = 0
    """At most this many notes (0 = all)."""
    seed: int = 0
    """Seed of every random choice (injected objects, sampling, corruptions)."""
    prompt: str = "Describe the note."
    """Caption prompt (the SFT caption prompt)."""
    samples: int = 4
    """On-policy: sampled captions per note."""
    temperature: float = 1.0
    """On-policy: sampling temperature."""
    max_new_tokens: int = 96
    """On-policy: longest sampled caption in tokens."""
    partner_prob: float = 1.0
    """Injection: probability of injecting an absent co-occurrence partner when one exists."""
    swap_prob: float = 0.5
    """Injection: probability of swapping the object in (else a sentence adds it)."""
    corruption: str = "crop"
    """Corrupt: the :mod:`rl.corrupt` kind."""
    batch_size: int = 16
    """Batch size for sampling and log-probs."""

    def __post_init__(self) -> None:
        if self.kind not in PAIR_KINDS:
            raise UserError(f"--kind must be one of {', '.join(PAIR_KINDS)}, got {self.kind!r}")
        if self.samples < 2 or self.batch_size < 1 or self.max_new_tokens < 1 or self.notes < 0:
            raise UserError(
                "need --samples >= 2, --batch-size >= 1, --max-new-tokens >= 1, --notes >= 0; got "
                f"{self.samples}, {self.batch_size}, {self.max_new_tokens}, {self.notes}"
            )
        for name in ("partner_prob", "swap_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UserError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(self, name)}")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="NoteVLM folder (OUT/model of `mm train`)")
    parser.add_argument("--data", required=True, help="note folder (notes.jsonl + images)")
    parser.add_argument(
        "--kind", required=True, choices=("injection", "onpolicy", "corrupt"), help="pair kind"
    )
    parser.add_argument("--out", required=True, help="output pairs JSONL (written atomically)")
    parser.add_argument("--split", default="train", help="note split to use (default train)")
    parser.add_argument("--notes", type=int, default=0, help="at most N notes (default 0 = all)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--prompt", default="Describe the note.", help="caption prompt")
    parser.add_argument("--samples", type=int, default=4, help="onpolicy: samples per note (default 4)")
    parser.add_argument("--temperature", type=float, default=1.0, help="onpolicy: temperature (default 1)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=96, help="onpolicy: caption length (default 96)"
    )
    parser.add_argument(
        "--partner-prob", type=float, default=1.0, help="injection: inject a partner (default 1)"
    )
    parser.add_argument("--swap-prob", type=float, default=0.5, help="injection: swap instead of add (0.5)")
    parser.add_argument(
        "--corruption",
        default="crop",
        choices=("noise", "crop", "patch_shuffle", "blank"),
        help="corrupt: image corruption (default crop, as mDPO)",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="batch size (default 16)")


def run(args: argparse.Namespace) -> int:
    # function-level: the model loader and the builders import torch and transformers (seconds);
    # `rl pairs --help` does not need them
    from mm.eval.runners import load_model
    from rl.pairs import corruption, files, injection, logps, onpolicy

    cfg = PairsConfig(
        kind=args.kind, split=args.split, notes=args.notes, seed=args.seed, prompt=args.prompt,
        samples=args.samples, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
        partner_prob=args.partner_prob, swap_prob=args.swap_prob, corruption=args.corruption,
        batch_size=args.batch_size,
    )  # fmt: skip
    out = Path(args.out)
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: folder {out.parent} does not exist; create it first")
    notes = [n for n in read_notes(args.data, split=cfg.split) if n.categories and n.text.strip()]
    if cfg.notes:
        notes = notes[: cfg.notes]
    if not notes:
        raise UserError(
            f"--data {args.data}: no {cfg.split!r} notes with a caption and objects; nothing written"
        )
    model, processor = load_model(args.model)
    if cfg.kind == "injection":
        pairs = injection.injection_pairs(
            notes, prompt=cfg.prompt, seed=cfg.seed, partner_prob=cfg.partner_prob, swap_prob=cfg.swap_prob
        )
    elif cfg.kind == "corrupt":
        pairs = corruption.corrupt_pairs(notes, prompt=cfg.prompt, corruption=cfg.corruption, seed=cfg.seed)
    else:
        pairs = onpolicy.onpolicy_pairs(
            model, processor, notes, args.data, prompt=cfg.prompt, num_samples=cfg.samples,
            temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
            seed=cfg.seed,
        )  # fmt: skip
    if not pairs:
        raise UserError(
            f"no {cfg.kind} pair could be built from {len(notes)} notes (on-policy: all samples tied); "
            "nothing written"
        )
    logps.add_logps(model, processor, pairs, args.data, batch_size=cfg.batch_size)
    files.write_pairs(pairs, out)
    gap = [p.chosen_logp - p.rejected_logp for p in pairs]
    mean_gap = sum(gap) / len(gap)
    print(
        f"wrote {len(pairs)} {cfg.kind} pairs from {len(notes)} {cfg.split} notes to {out}; "
        f"mean policy logp/token chosen - rejected = {mean_gap:+.4f}"
        + ("" if math.isfinite(mean_gap) else " (non-finite!)")
    )
    return 0
