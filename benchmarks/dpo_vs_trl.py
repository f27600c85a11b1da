"""Step time of ``rl dpo --model`` against TRL's ``DPOTrainer`` on the same tiny LLaVA and the same pairs.

    python benchmarks/dpo_vs_trl.py                         # LLaVA, LM hidden 256 x 4 layers, 8 pairs/step
    python benchmarks/dpo_vs_trl.py --hidden 64 --layers 2 --steps 4 --rounds 2 --json out.json

Both sides train one saved LLaVA-1.5-layout model (2-layer CLIP tower on 16 px images, a random Llama LM
of ``--hidden`` x ``--layers``, :func:`tests.mm.adapter_helpers.build_llava`) with the same LoRA (the
adapter's LLaVA defaults: the LM's q/k/v/o and MLP projections, r=8), reference = the adapters off,
sigmoid DPO with beta 0.1, AdamW at a constant rate, gradient clip 1.0, float32 on the CPU (TRL:
``use_cpu=True, bf16=False``), on the same pairs (one 16 px image, a question, two answers) in the same
batch size:

- ours: the code path of ``rl dpo --model`` (:class:`rl.trainers.dpo_files.FilePairBatcher` reads the
  image files and builds the rows with the processor, :class:`rl.trainers.dpo.DPOTrainer` scores them
  through the adapter); a step = batch + loss + backward + clip + optimizer step.
- TRL: ``DPOTrainer`` with ``DataCollatorForVisionPreference`` (images decoded from the dataset, rows
  built with the processor) on the same prompts (the model's chat template) and answers (+ eos);
  a step = the time between two ``on_step_end`` callbacks (collation included, as ours).

Runs ``--rounds`` alternating rounds (ours, then TRL, each from the same saved weights) so load drift on a
shared machine hits both sides; prints the medians of all step times after each round's first (warm-up)
step, their ratio ours / TRL (target <= 1.0x), each round's ratio and the load average. Compare ratios
from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
WORDS = "a red cup a blue plate a dog a cat on the table next to the window in the kitchen there is".split()


def build_model(folder: Path, *, hidden: int, layers: int) -> Path:
    """The tiny LLaVA of the tests with a ``hidden`` x ``layers`` Llama LM, saved with its processor."""
    sys.path.insert(0, str(ROOT))
    from transformers import LlavaForConditionalGeneration

    from tests.mm.adapter_helpers import build_llava

    model, processor = build_llava(seed=0)
    text = model.config.text_config
    text.hidden_size, text.intermediate_size, text.num_hidden_layers = hidden, 2 * hidden, layers
    text.num_attention_heads, text.num_key_value_heads = 4, 2
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(model.config).eval()
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def texts(n: int, words: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [
        " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (words,), generator=g)) for _ in range(n)
    ]


def write_pairs(folder: Path, n: int) -> Path:
    """``n`` native pair records (one 16 px random image each) and their images under ``folder``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    q, c, r = texts(n, 8, 1), texts(n, 24, 2), texts(n, 24, 3)
    with (folder / "pairs.jsonl").open("w") as f:
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / f"{i}.png")
            f.write(
                json.dumps({"image": f"{i}.png", "question": q[i], "chosen": c[i], "rejected": r[i]}) + "\n"
            )
    return folder / "pairs.jsonl"


def ours(model_dir: Path, pairs_file: Path, *, batch: int, steps: int, lr: float) -> list[float]:
    """Step times of the ``rl dpo --model`` code path."""
    from mm.model.adapter import load_adapter
    from mm.train.loop import clip_grad_norm
    from rl.pairs.importers import read_pair_file
    from rl.trainers.common import Reference
    from rl.trainers.dpo import DPOTrainer, LossConfig
    from rl.trainers.dpo_files import FilePairBatcher
    from rl.trainers.dpo_score import AdapterScorer

    pairs, _ = read_pair_file(pairs_file, pairs_file.parent, "native")
    adapter = load_adapter(model_dir)
    adapter.apply_lora(r=8, alpha=16)
    ref = Reference(model=adapter.model, needed=True)
    trainer = DPOTrainer(
        model=adapter.model, scorer=AdapterScorer(adapter, ref), loss=LossConfig(beta=0.1),
        pairs=FilePairBatcher(adapter=adapter, pairs=pairs), batch_size=batch, seed=0,
        device=torch.device("cpu"), rank=0, world=1,
    )  # fmt: skip
    params = [p for p in adapter.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    adapter.model.train()
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        loss, _ = trainer.loss(trainer.batch(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def trl(model_dir: Path, pairs_file: Path, out: Path, *, batch: int, steps: int, lr: float) -> list[float]:
    """Step times of TRL's ``DPOTrainer`` on the same model, LoRA, pairs and batch size."""
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from mm.model.adapter import Sample, load_adapter

    adapter = load_adapter(model_dir)  # the same prompt text (chat template) and the same LoRA targets
    peft_config = adapter.lora_config(r=8, alpha=16, dropout=0.0, target_modules=None)
    eos = adapter.tokenizer.eos_token
    rows = []
    for line in pairs_file.read_text().splitlines():
        rec = json.loads(line)
        image = Image.open(pairs_file.parent / rec["image"]).convert("RGB")
        prompt = adapter.chat_text(Sample(images=[image], text=rec["question"]))
        rows.append({"images": [image], "prompt": prompt, "chosen": rec["chosen"] + eos,
                     "rejected": rec["rejected"] + eos})  # fmt: skip
    ends: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    args = DPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, max_steps=steps, report_to=[], save_strategy="no",
        logging_steps=10_000, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=batch, dataloader_num_workers=0,
        disable_tqdm=True, seed=0, beta=0.1, loss_type=["sigmoid"], max_length=None,
        remove_unused_columns=False,
    )  # fmt: skip
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), local_files_only=True)
    processor = AutoProcessor.from_pretrained(str(model_dir), local_files_only=True)
    trainer = DPOTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=processor,
        peft_config=peft_config, callbacks=[Timer()],
    )  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    return [b - a for a, b in zip([start, *ends[:-1]], ends)]


def median_after_warmup(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def run(args: argparse.Namespace) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = build_model(root / "llava", hidden=args.hidden, layers=args.layers)
        pairs_file = write_pairs(root, args.batch * args.steps)
        ours_times: list[float] = []
        trl_times: list[float] = []
        rounds = []
        for i in range(args.rounds):
            a = ours(model_dir, pairs_file, batch=args.batch, steps=args.steps, lr=args.lr)
            b = trl(model_dir, pairs_file, root / f"trl{i}", batch=args.batch, steps=args.steps, lr=args.lr)
            ours_times += a[1:]
            trl_times += b[1:]
            rounds.append(round(median_after_warmup(a) / median_after_warmup(b), 3))
    o, t = statistics.median(ours_times), statistics.median(trl_times)
    return {
        "model": f"llava (CLIP 2x32 on 16 px, Llama {args.layers}x{args.hidden}), LoRA r=8, float32 CPU",
        "batch_pairs": args.batch,
        "steps": args.steps,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "ours_step_s": round(o, 4),
        "trl_step_s": round(t, 4),
        "ratio": round(o / t, 3),
        "round_ratios": rounds,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=256, help="LM hidden size (default 256)")
    p.add_argument("--layers", type=int, default=4, help="LM layers (default 4)")
    p.add_argument("--batch", type=int, default=8, help="pairs per step (default 8)")
    p.add_argument("--steps", type=int, default=6, help="steps per side and round, the first is warm-up (6)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate of both sides (default 1e-4)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--json", default=None, help="also write the result to this file")
    args = p.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
