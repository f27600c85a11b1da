"""NoteVLM vs transformers' ``LlavaForConditionalGeneration`` of matching size, in one run.

Both models are built here at random init, CPU, float32, with the same parts:

- vision: a transformers ``CLIPVisionModel`` of the same width/layers/heads/patches (NoteVLM vision kind
  ``hf_clip``; LLaVA's ``vision_config``), patch tokens of the last layer, CLS dropped (LLaVA with
  ``vision_feature_layer=-1``, ``vision_feature_select_strategy="default"``);
- fusion: NoteVLM ``mlp`` at K = P (no pooling) vs LLaVA's ``multi_modal_projector`` (both
  ``Linear -> GELU -> Linear`` with biases); NoteVLM ``qformer`` / ``resampler`` at the same K are
  timed too, for information;
- LM: the same Qwen2 text config (``Qwen2Model`` + a separate ``lm_head``).

Before timing, LLaVA receives NoteVLM(mlp)'s weights, and the script checks that both give the same logits
and the same greedy tokens: the two models compute the same function, so the timings compare
implementations, not architectures.

The batch: ``--batch`` single-image notes (LLaVA takes one image per sample), each ``K`` ``<image>``
tokens followed by ``--text-tokens`` random text tokens, no padding; labels are the text tokens.

Figures (medians of ``--runs`` timed runs after ``--warmup`` runs, and the ratios of the fastest runs; the
models alternate run by run so that a change of machine load hits both):

- train step: forward + loss + backward + ``torch.optim.AdamW`` step + ``zero_grad``;
- cached greedy generation: ``generate(max_new_tokens=min_new_tokens=--new-tokens, do_sample=False,
  use_cache=True)`` on the whole batch, no eos (the configs have none), the same ``suppress_tokens``
  (``<image>``) for both; tokens/s = batch x new tokens / seconds (prefill included);
- parameters of each part, with the names only one model has.

``--profile`` adds, for one train step and one generation of each model, the top operators by self CPU
time (``torch.profiler``).

Usage: ``python benchmarks/notevlm_bench.py [--threads 1 --batch 8 --runs 7 --profile]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

IMAGE_TOKEN_ID = 4
"""``<image>`` id in both models (the project tokenizer's id)."""
PAD_TOKEN_ID = 0
"""Pad id given to both generation configs (no padding is used)."""
FUSION_KINDS = ("mlp", "qformer", "resampler")


@dataclass(kw_only=True)
class BenchSizes:
    """Sizes shared by both models and the batch."""

    image_size: int
    """Image side in pixels."""
    patch_size: int
    """Patch side in pixels; P = (image_size / patch_size)^2 = K."""
    vision_width: int
    """CLIP width D_v."""
    vision_layers: int
    """CLIP encoder layers."""
    vision_heads: int
    """CLIP attention heads."""
    hidden_size: int
    """LM width D."""
    intermediate_size: int
    """LM MLP hidden size."""
    layers: int
    """LM decoder layers."""
    heads: int
    """LM attention heads."""
    kv_heads: int
    """LM key/value heads."""
    vocab_size: int
    """LM vocabulary."""
    batch: int
    """Notes per batch (one image each)."""
    text_tokens: int
    """Text tokens after the K image tokens of each note."""

    @property
    def num_patches(self) -> int:
        """P (= K, the image tokens per note)."""
        return (self.image_size // self.patch_size) ** 2

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"--image-size {self.image_size} must be a multiple of --patch-size {self.patch_size}"
            )
        if self.vocab_size <= IMAGE_TOKEN_ID:
            raise ValueError(f"--vocab must exceed the <image> id {IMAGE_TOKEN_ID}, got {self.vocab_size}")


def text_config(s: BenchSizes) -> dict[str, Any]:
    """The Qwen2 config dict both models use."""
    return {
        "model_type": "qwen2",
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "pad_token_id": PAD_TOKEN_ID,
    }


def build_notevlm(s: BenchSizes, kind: str = "mlp") -> Any:
    """NoteVLM with an ``hf_clip`` tower and fusion ``kind`` at K = P (one image slot per note)."""
    from mm.model import NoteVLMConfig, NoteVLMForConditionalGeneration

    vision = {
        "kind": "hf_clip",
        "image_size": s.image_size,
        "patch_size": s.patch_size,
        "width": s.vision_width,
        "layers": s.vision_layers,
        "heads": s.vision_heads,
        "mlp_ratio": 4.0,
    }
    fusion_kwargs = {} if kind == "mlp" else {"layers": 2, "heads": 4}
    config = NoteVLMConfig(
        vision_config=vision,
        fusion_kind=kind,
        fusion_budget=s.num_patches,
        fusion_kwargs=fusion_kwargs,
        text_config=text_config(s),
        image_token_id=IMAGE_TOKEN_ID,
        max_images=1,
        pad_token_id=PAD_TOKEN_ID,
    )
    return NoteVLMForConditionalGeneration(config).eval()


def build_llava(s: BenchSizes) -> Any:
    """transformers LLaVA with the same CLIP tower, projector and Qwen2 LM as :func:`build_notevlm`."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": s.vision_width,
        "intermediate_size": 4 * s.vision_width,
        "num_hidden_layers": s.vision_layers,
        "num_attention_heads": s.vision_heads,
        "image_size": s.image_size,
        "patch_size": s.patch_size,
    }
    config = LlavaConfig(
        vision_config=vision,
        text_config=text_config(s),
        image_token_index=IMAGE_TOKEN_ID,
        image_seq_length=s.num_patches,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        pad_token_id=PAD_TOKEN_ID,
    )
    return LlavaForConditionalGeneration(config).eval()


def notevlm_to_llava_key(name: str) -> str | None:
    """The LLaVA parameter name of NoteVLM(mlp) parameter ``name``; None when LLaVA has no such part."""
    rules = (
        ("model.vision_tower.encoder.", "model.vision_tower."),
        ("model.fusion.fc1.", "model.multi_modal_projector.linear_1."),
        ("model.fusion.fc2.", "model.multi_modal_projector.linear_2."),
        ("model.language_model.", "model.language_model."),
        ("lm_head.", "lm_head."),
    )
    for old, new in rules:
        if name.startswith(old):
            return new + name[len(old) :]
    return None


@torch.no_grad()
def copy_weights(notevlm: Any, llava: Any) -> list[str]:
    """Copy NoteVLM(mlp)'s parameters into LLaVA; returns the LLaVA parameter names left untouched."""
    dst = dict(llava.named_parameters())
    copied = set()
    for name, p in notevlm.named_parameters():
        key = notevlm_to_llava_key(name)
        if key is None or key not in dst or dst[key].shape != p.shape:
            raise ValueError(f"NoteVLM parameter {name} {tuple(p.shape)} has no LLaVA counterpart ({key})")
        dst[key].copy_(p)
        copied.add(key)
    return sorted(set(dst) - copied)


MM_TRAIN = "notevlm mlp, mm train loss"
"""Row of NoteVLM's step with the loss ``mm train`` uses (LM head on answer positions only)."""


def make_batch(s: BenchSizes, seed: int = 0) -> dict[str, torch.Tensor]:
    """input_ids/attention_mask/labels (B, K + T_text) and pixel_values (B, 3, H, W), seeded."""
    g = torch.Generator().manual_seed(seed)
    B, K = s.batch, s.num_patches
    text = torch.randint(IMAGE_TOKEN_ID + 1, s.vocab_size, (B, s.text_tokens), generator=g)  # (B, T_text)
    image = torch.full((B, K), IMAGE_TOKEN_ID, dtype=torch.long)  # (B, K)
    input_ids = torch.cat([image, text], dim=1)  # (B, T)
    labels = torch.cat([torch.full_like(image, -100), text], dim=1)  # (B, T)
    pixels = torch.randn(B, 3, s.image_size, s.image_size, generator=g)  # (B, 3, H, W)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "labels": labels,
        "pixel_values": pixels,
    }


def model_inputs(model: Any, batch: dict[str, torch.Tensor], *, labels: bool) -> dict[str, torch.Tensor]:
    """The batch as ``model`` takes it: NoteVLM wants pixel_values (B, N=1, 3, H, W)."""
    from mm.model import NoteVLMForConditionalGeneration

    out = dict(batch)
    if not labels:
        out.pop("labels")
    if isinstance(model, NoteVLMForConditionalGeneration):
        out["pixel_values"] = batch["pixel_values"][:, None]  # (B, 1, 3, H, W)
    return out


def train_step_fn(
    model: Any, batch: dict[str, torch.Tensor], *, answer_only: bool = False
) -> Callable[[], None]:
    """One training step (forward + loss + backward + AdamW + zero_grad) as a closure.

    ``answer_only``: the loss of ``mm train`` (``mm.train.sft.answer_loss``: the LM head only on answer
    positions, same value) instead of the model's own ``.loss``.
    """
    from mm.train.sft import answer_loss, answer_token_divisor

    inputs = model_inputs(model, batch, labels=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    divisor = answer_token_divisor(inputs["labels"], 1)

    def step() -> None:
        model.train()
        loss = answer_loss(model, inputs, None, divisor) if answer_only else model(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def generate_fn(model: Any, batch: dict[str, torch.Tensor], new_tokens: int) -> Callable[[], torch.Tensor]:
    """Cached greedy generation of exactly ``new_tokens`` tokens per prompt as a closure."""
    inputs = model_inputs(model, batch, labels=False)

    @torch.no_grad()
    def gen() -> torch.Tensor:
        model.eval()
        out = model.generate(
            **inputs,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
            suppress_tokens=[IMAGE_TOKEN_ID],
            pad_token_id=PAD_TOKEN_ID,
        )
        if out.shape[1] != inputs["input_ids"].shape[1] + new_tokens:
            raise RuntimeError(
                f"expected {new_tokens} new tokens, got {out.shape[1] - inputs['input_ids'].shape[1]}"
            )
        return out

    return gen


def time_interleaved(fns: dict[str, Callable[[], Any]], *, runs: int, warmup: int) -> dict[str, list[float]]:
    """Wall seconds of every timed run of each closure; closures alternate within every round."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def part_counts(model: Any) -> dict[str, int]:
    """Parameters per part: vision, fusion/projector, lm (decoder), lm_head."""
    parts = {"vision": 0, "fusion": 0, "lm": 0, "lm_head": 0}
    for name, p in model.named_parameters():
        if name.startswith("model.vision_tower."):
            parts["vision"] += p.numel()
        elif name.startswith(("model.fusion.", "model.multi_modal_projector.")):
            parts["fusion"] += p.numel()
        elif name.startswith("model.language_model."):
            parts["lm"] += p.numel()
        else:
            parts["lm_head"] += p.numel()
    return parts


@torch.no_grad()
def parity(notevlm: Any, llava: Any, batch: dict[str, torch.Tensor], new_tokens: int) -> tuple[float, bool]:
    """max |logits difference| of one forward, and whether greedy tokens agree (same weights)."""
    a = notevlm(**model_inputs(notevlm, batch, labels=False)).logits
    b = llava(**model_inputs(llava, batch, labels=False)).logits
    diff = float((a - b).abs().max())
    same = torch.equal(generate_fn(notevlm, batch, new_tokens)(), generate_fn(llava, batch, new_tokens)())
    return diff, same


def profile_table(fn: Callable[[], Any], rows: int) -> str:
    """Top ``rows`` operators by self CPU time of one call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def load_line() -> str:
    """The 1/5/15-minute load averages and the core count (the machine may be shared)."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def sizes_from_args(args: argparse.Namespace) -> BenchSizes:
    """The :class:`BenchSizes` of parsed arguments (``ValueError`` on inconsistent sizes)."""
    return BenchSizes(
        image_size=args.image_size,
        patch_size=args.patch_size,
        vision_width=args.vision_width,
        vision_layers=args.vision_layers,
        vision_heads=args.vision_heads,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        vocab_size=args.vocab,
        batch=args.batch,
        text_tokens=args.text_tokens,
    )


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="NoteVLM vs transformers LLaVA of matching size: train step, cached generation, params."
    )
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--image-size", type=int, default=64, help="image side in pixels (default 64)")
    p.add_argument(
        "--patch-size", type=int, default=8, help="patch side; K = P = (image/patch)^2 (default 8)"
    )
    p.add_argument("--vision-width", type=int, default=128, help="CLIP width (default 128)")
    p.add_argument("--vision-layers", type=int, default=4, help="CLIP layers (default 4)")
    p.add_argument("--vision-heads", type=int, default=4, help="CLIP heads (default 4)")
    p.add_argument("--hidden-size", type=int, default=256, help="LM width (default 256)")
    p.add_argument("--intermediate-size", type=int, default=768, help="LM MLP size (default 768)")
    p.add_argument("--layers", type=int, default=4, help="LM layers (default 4)")
    p.add_argument("--heads", type=int, default=8, help="LM heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=4, help="LM key/value heads (default 4)")
    p.add_argument("--vocab", type=int, default=None, help="LM vocabulary (default: the shipped tokenizer's)")
    p.add_argument("--batch", type=int, default=8, help="single-image notes per batch (default 8)")
    p.add_argument("--text-tokens", type=int, default=32, help="text tokens after the image (default 32)")
    p.add_argument("--new-tokens", type=int, default=32, help="generated tokens per prompt (default 32)")
    p.add_argument("--runs", type=int, default=7, help="timed runs per figure, median (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    p.add_argument(
        "--kinds", default="mlp,qformer,resampler", help="NoteVLM fusion kinds to time (mlp is always run)"
    )
    p.add_argument("--profile", action="store_true", help="print torch.profiler top operators")
    p.add_argument("--profile-rows", type=int, default=15, help="operators per profile table (default 15)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    kinds = ["mlp"] + [k for k in args.kinds.split(",") if k and k != "mlp"]
    unknown = sorted(set(kinds) - set(FUSION_KINDS))
    if unknown or args.runs < 1 or args.warmup < 0 or args.threads < 1:
        print(
            f"error: --kinds must name {', '.join(FUSION_KINDS)} (got {unknown}); "
            "--runs >= 1, --warmup >= 0, --threads >= 1",
            file=sys.stderr,
        )
        return 2
    if args.vocab is None:
        from mm.data.tokenizer import load_tokenizer

        args.vocab = len(load_tokenizer())
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    try:
        s = sizes_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    models = {f"notevlm {k}": build_notevlm(s, k) for k in kinds}
    llava = build_llava(s)
    only_llava = copy_weights(models["notevlm mlp"], llava)
    models["llava"] = llava
    batch = make_batch(s)
    K, T = s.num_patches, s.num_patches + s.text_tokens
    print(
        f"NoteVLM vs LLaVA | CPU float32, {torch.get_num_threads()} thread(s) | batch {s.batch} notes "
        f"x 1 image, K=P={K} image tokens + {s.text_tokens} text = {T} tokens | CLIP "
        f"{s.vision_width}x{s.vision_layers} on {s.image_size}px/{s.patch_size} | Qwen2 "
        f"{s.hidden_size}x{s.layers} ({s.heads}/{s.kv_heads} heads), vocab {s.vocab_size}"
    )
    attn = {n: m.config.text_config._attn_implementation for n, m in models.items()}
    print(f"attention: {attn}")
    print(f"start: {load_line()}")
    diff, same = parity(models["notevlm mlp"], llava, batch, args.new_tokens)
    print(f"same weights: max |logits NoteVLM(mlp) - LLaVA| = {diff:.2e}; same greedy tokens: {same}")

    step_fns = {n: train_step_fn(m, batch) for n, m in models.items()}
    step_fns[MM_TRAIN] = train_step_fn(models["notevlm mlp"], batch, answer_only=True)
    step_runs = time_interleaved(step_fns, runs=args.runs, warmup=args.warmup)
    gen_runs = time_interleaved(
        {n: generate_fn(m, batch, args.new_tokens) for n, m in models.items()},
        runs=args.runs,
        warmup=args.warmup,
    )
    print(f"end:   {load_line()}")
    steps = {n: statistics.median(ts) for n, ts in step_runs.items()}
    gens = {n: statistics.median(ts) for n, ts in gen_runs.items()}
    fastest_step = min(step_runs["notevlm mlp"]) / min(step_runs["llava"])
    fastest_gen = min(gen_runs["llava"]) / min(gen_runs["notevlm mlp"])

    counts = {n: part_counts(m) for n, m in models.items()}
    new = s.batch * args.new_tokens
    print()
    print(
        "| model | params | vision | fusion | lm + head | train step ms | vs LLaVA "
        f"| gen tok/s ({args.new_tokens} new) | vs LLaVA |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in models:
        c = counts[n]
        print(
            f"| {n} | {sum(c.values()):,} | {c['vision']:,} | {c['fusion']:,} | {c['lm'] + c['lm_head']:,} "
            f"| {steps[n] * 1e3:.1f} | {steps[n] / steps['llava']:.2f}x | {new / gens[n]:.0f} "
            f"| {gens['llava'] / gens[n]:.2f}x |"
        )
    print(
        f"| {MM_TRAIN} | (same model) | | | | {steps[MM_TRAIN] * 1e3:.1f} "
        f"| {steps[MM_TRAIN] / steps['llava']:.2f}x | | |"
    )
    print()
    print(
        f"train step NoteVLM(mlp)/LLaVA = {steps['notevlm mlp'] / steps['llava']:.2f}x (target <= 1.0x); "
        "generation tokens/s NoteVLM(mlp)/LLaVA = "
        f"{gens['llava'] / gens['notevlm mlp']:.2f}x (target >= 1.0x); the same ratios from the fastest "
        f"run of each: {fastest_step:.2f}x, {fastest_gen:.2f}x"
    )
    delta = sum(counts["notevlm mlp"].values()) - sum(counts["llava"].values())
    sizes = {k: tuple(p.shape) for k, p in llava.named_parameters() if k in only_llava}
    print(f"params NoteVLM(mlp) - LLaVA = {delta:+,}; only in LLaVA: {sizes or 'none'}")
    if only_llava and all(".post_layernorm." in k for k in only_llava):
        print(
            "  (CLIP's post_layernorm only normalises the pooled CLS output, which neither model uses; "
            "mm.vision drops it, LLaVA keeps it and it never gets a gradient)"
        )

    if args.profile:
        for n in ("notevlm mlp", "llava"):
            print(f"\n## profile: train step, {n}\n")
            print(profile_table(train_step_fn(models[n], batch), args.profile_rows))
            print(f"\n## profile: generation, {n}\n")
            print(profile_table(generate_fn(models[n], batch, args.new_tokens), args.profile_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
