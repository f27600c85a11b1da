"""GRPO / DAPO / GSPO on any model folder and a prompt file (``rl grpo --model DIR --prompts P.jsonl``).

The step is :mod:`rl.trainers.grpo`'s (same advantages, clipped loss, KL, DAPO options, loop), on the
model interface of :mod:`mm.model.adapter` instead of NoteVLM's internals:

1. ``prompts_per_step`` records of the prompt file become :class:`mm.model.adapter.Sample` prompts; a
   rollout engine (:mod:`rl.rollout`: in process, or vLLM) samples ``G`` completions each and reports
   the log-probs of the distribution it sampled from when that is not the trainer's;
2. the reward (:mod:`rl.trainers.grpo_rewards`: a built-in on the record's ground truth, or any
   ``module:function``; :mod:`rl.trainers.grpo_files_sourced`: a labeler VLM or a reward model, no ground
   truth) scores each decoded completion;
3. the sampled ids (never re-tokenised) are appended to the prompts by ``adapter.answer_batch``, the same
   layout for every family, and scored with one forward (:func:`adapter_token_logps`);
4. when the engine sampled off the trainer's distribution (top-k / top-p, vLLM), each token's loss is
   weighted by the truncated importance weight ``min(pi_old / mu, C)`` (:mod:`rl.importance`).

Data parallel as :mod:`rl.trainers.grpo` (:mod:`rl.trainers.grpo_shard`): each rank samples its shard of
every step's records, each record's completions from its own seeded generator (the engine's ``seeds``).

Deviations from :mod:`rl.trainers.grpo`: the vision encoder is frozen under full fine-tuning (as there);
a prompt is encoded by the processor once per completion (as TRL, which repeats prompts ``G`` times).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from mm.config import to_dict
from mm.errors import UserError
from mm.model.adapter import load_adapter
from mm.model.adapter.base import NOT_MODEL_INPUTS
from mm.model.adapter.batching import first_response_column, gather_logps
from mm.train import common, loop
from mm.train.common import rank_world
from rl.importance import truncated_is_weights
from rl.kl import entropy_from_logits
from rl.rollout import Completions, SamplingSpec, build_engine
from rl.rollout.seeded import prompt_seed
from rl.sampling import overlong_penalty
from rl.trainers.common import Reference, make_optimizer, start_run, trained_adapter
from rl.trainers.grpo import GRPO_PLOT_KEYS, compute_advantages, grpo_loss, shard_loss
from rl.trainers.grpo_files_config import GRPOFilesConfig
from rl.trainers.grpo_files_data import PromptImages, read_prompts
from rl.trainers.grpo_files_sourced import SourcedFilesReward, build_sourced_reward, yesno_rows
from rl.trainers.grpo_rewards import BuiltinReward, build_reward, call_reward
from rl.trainers.grpo_shard import (
    collect_groups,
    counts,
    gather_rewards,
    global_counts,
    local_rows,
    shard_positions,
    step_metrics,
)
from rl.trainers.monitor import failure_warnings

VISION_PARTS = ("vision_tower", "vision_model", "visual.", "vision_encoder")
"""Parameter-name fragments of vision encoders, frozen under full fine-tuning."""


def adapter_token_logps(
    model: Any, batch: dict[str, Any], *, adapter: Any, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probs ``(B, W)`` of the answer tokens of an ``adapter.answer_batch`` batch under ``model`` (the
    adapter's model, its reference copy, or it with LoRA off), the mask ``(B, W)`` and the entropy.

    The same forward as :meth:`VLMAdapter.token_logps` (positions from ``adapter.position_ids``, logits
    from the first answer column on), returned over the window ``W = T - start`` as
    :func:`rl.trainers.common.batch_token_logps`, with the detached entropy when ``with_entropy``.
    """
    ids, resp = batch["input_ids"], batch["response_mask"]  # (B, T)
    start = first_response_column(resp)
    keep = ids.shape[1] - start + 1
    inputs = {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS}
    positions = adapter.position_ids(batch)
    if positions is not None:
        inputs["position_ids"] = positions
    logits = model(**inputs, use_cache=False, logits_to_keep=keep).logits[:, -keep:-1]  # (B, W, V)
    mask = resp[:, start:]  # (B, W)
    logps = gather_logps(logits, ids[:, start:], temperature=temperature).masked_fill(mask == 0, 0.0)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach().float() / temperature)  # (B, W)
    return logps, mask, entropy


def rollout_logps_window(comps: list[list[float]], width: int, device: torch.device) -> torch.Tensor:
    """Per-row sampling log-probs -> ``(B, W)`` aligned with the answer window (0 after each row)."""
    out = torch.zeros(len(comps), width, device=device)
    for i, row in enumerate(comps):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def freeze_vision(model: Any) -> int:
    """Freeze the vision encoder's parameters (:data:`VISION_PARTS`); returns how many were frozen."""
    n = 0
    for name, p in model.named_parameters():
        if any(part in name for part in VISION_PARTS):
            p.requires_grad_(False)
            n += 1
    return n


class FilesGRPOTrainer(loop.StepTrainer):
    """A step's batch is a scored, advantage-weighted rollout of prompt-file records; its loss is
    :func:`rl.trainers.grpo.grpo_loss` on the adapter's scorer, with importance weights when needed."""

    def __init__(
        self,
        cfg: GRPOFilesConfig,
        adapter: Any,
        engine: Any,
        ref: Reference,
        prompts: PromptImages,
        reward: Any,
    ) -> None:
        self.cfg, self.adapter, self.engine, self.ref, self.prompts, self.reward = (
            cfg, adapter, engine, ref, prompts, reward,
        )  # fmt: skip
        self.model = adapter.model
        self.updates_per_step = cfg.algo.num_iterations
        self.rank, self.world = rank_world()
        self.positions = shard_positions(cfg.data.prompts_per_step, rank=self.rank, world=self.world)
        """This rank's positions in every sampling batch of prompts (whole groups)."""
        self.stale = False
        """The weights changed since the engine last synced (vLLM holds its own copy)."""

    def scorer(self, model: Any, batch: dict[str, Any], **kw: Any) -> Any:
        return adapter_token_logps(model, batch, adapter=self.adapter, **kw)

    def _sample(self, step: int, k: int) -> tuple[list[Any], torch.Tensor, dict[str, tuple[float, float]]]:
        """Sampling batch ``k`` of ``step``: this rank's groups (None for the other ranks' positions), the
        global ``(B, G)`` rewards and this rank's reward components as ``(sum, count)``."""
        cfg, G = self.cfg, self.cfg.rollout.group_size
        B = cfg.data.prompts_per_step
        idx = common.batch_indices(
            len(self.prompts.records), B, seed=cfg.train.seed, step=step * cfg.algo.max_sample_batches + k,
        )  # fmt: skip
        mine = [idx[p] for p in self.positions]
        samples = [self.prompts.sample(i) for i in mine]
        if self.stale:  # once per rollout, not after every inner update
            self.engine.sync()
            self.stale = False
        seeds = [prompt_seed(cfg.train.seed, step, k, p) for p in self.positions]
        comps: Completions = self.engine.generate(samples, seeds=seeds)
        tok = self.adapter.tokenizer
        texts = [t.strip() for t in tok.batch_decode(comps.token_ids, skip_special_tokens=True)]
        records = [self.prompts.records[i] for i in mine for _ in range(G)]
        parts: dict[str, tuple[float, float]] = {}
        if isinstance(self.reward, SourcedFilesReward):  # one batched call: labeler or reward model
            rewards, means = self.reward.score([i for i in mine for _ in range(G)], texts)  # (b*G,)
            parts = {k: (v * len(texts), float(len(texts))) for k, v in means.items()}
        else:
            rewards = torch.tensor(
                [call_reward(self.reward, r.question, t, r.record) for r, t in zip(records, texts)]
            )  # (b*G,)
        if isinstance(self.reward, BuiltinReward):
            for r, t in zip(records, texts):
                for name, v in self.reward.score(t, r.record).components.items():
                    s0, n0 = parts.get(f"reward_{name}", (0.0, 0.0))
                    parts[f"reward_{name}"] = (s0 + v, n0 + 1)
        if cfg.algo.overlong_penalty:
            lengths = torch.tensor([len(t) for t in comps.token_ids])
            rewards = rewards + overlong_penalty(
                lengths, max_length=cfg.rollout.max_new_tokens, cache_length=cfg.algo.overlong_cache,
                factor=cfg.algo.overlong_factor,
            )  # fmt: skip
        groups: list[Any] = [None] * B
        for g, (p, s) in enumerate(zip(self.positions, samples)):
            rows = slice(g * G, (g + 1) * G)
            groups[p] = {
                "sample": s, "ids": comps.token_ids[rows], "truncated": comps.truncated[rows],
                "logps": None if comps.logps is None else comps.logps[rows],
            }  # fmt: skip
        return groups, gather_rewards(rewards.view(len(mine), G), world=self.world), parts

    def batch(self, step: int) -> dict[str, Any]:
        """This rank's rows of the rollout of ``step``: answer batch, advantages (from the global batch's
        rewards), old / reference log-probs, IS weights, loss weights and the global metrics."""
        cfg, algo, ro = self.cfg, self.cfg.algo, self.cfg.rollout
        G = ro.group_size
        kept, rewards, groups, weighted, seen, stats = collect_groups(
            lambda k: self._sample(step, k), dynamic=algo.dynamic_sampling,
            target_groups=cfg.data.prompts_per_step, max_batches=algo.max_sample_batches,
        )  # fmt: skip
        samples = [g["sample"] for g in groups for _ in range(G)]
        ids = [t for g in groups for t in g["ids"]]
        batch = self.adapter.answer_batch(samples, ids)  # (b*G, T) + response_mask, on the model's device
        flat = rewards.reshape(-1)  # (B*G,) the global batch's kept rewards
        adv_all = compute_advantages(flat, group_size=G, cfg=algo)  # (B*G,)
        adv = (adv_all[local_rows(kept, G)] if weighted else torch.zeros(G)).to(self.adapter.device)
        recorded = all(g["logps"] is not None for g in groups)
        with torch.no_grad():
            old = weights = None
            if algo.num_iterations > 1 or recorded:
                old, mask, _ = self.scorer(self.model, batch, temperature=ro.temperature)  # (b*G, W)
            if recorded:
                mu = rollout_logps_window([r for g in groups for r in g["logps"]], old.shape[1], old.device)
                weights = truncated_is_weights(old, mu, mask, cap=ro.tis_cap, level=ro.tis_level)  # (b*G, W)
            ref = None
            if self.ref.kind != "none":
                with self.ref.model() as ref_model:
                    ref = self.scorer(ref_model, batch, temperature=ro.temperature)[0]
        local = counts(batch["response_mask"], weighted=weighted)
        total = global_counts(local, world=self.world)
        n = len(ids) if weighted else 0
        stats["response_len"] = (float(sum(len(t) for t in ids)) if weighted else 0.0, n)
        cut = sum(t for g in groups for t in g["truncated"])
        stats["truncated_frac"] = (float(cut) if weighted else 0.0, n)
        metrics = step_metrics(
            rewards=flat, advantages=adv_all, sampled=seen, group_size=G, stats=stats, weights=weights,
            mask=mask if weights is not None and weighted else None, tis_cap=ro.tis_cap, world=self.world,
        )  # fmt: skip
        out = {"rows": batch, "adv": adv, "old": old, "ref": ref, "weights": weights, "metrics": metrics}
        return {**out, "counts": (local, total)}

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        ro = self.cfg.rollout
        loss, m = grpo_loss(
            self.model, batch["rows"], batch["adv"], self.cfg.algo, old_logps=batch["old"],
            ref_logps=batch["ref"], temperature=ro.temperature, horizon=ro.max_new_tokens,
            is_weights=batch["weights"], scorer=self.scorer,
        )  # fmt: skip
        return shard_loss(loss, m, batch, self.cfg.algo, self.world)

    def after_update(self) -> None:
        self.stale = True


def _dtype(name: str) -> Any:
    return None if name == "auto" else name


def prepare(cfg: GRPOFilesConfig) -> tuple[list[Any], Any]:
    """Check what can be checked before a model is loaded: the model folder, the engine, the prompt file,
    its images and the reward (import, signature, each record's ground truth). Returns (records, reward)."""
    if not cfg.model.path:
        raise UserError("no model: pass --model DIR (a NoteVLM or transformers image-text-to-text folder)")
    if not Path(cfg.model.path).is_dir():
        raise UserError(
            f"model folder {cfg.model.path} not found (--model takes a local folder, never a hub id)"
        )
    if not cfg.data.prompts:
        raise UserError("no prompts: pass --prompts P.jsonl (one JSON object a line: image, question)")
    if cfg.rollout.engine == "vllm":
        from rl.rollout.vllm import import_vllm

        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise UserError(
                "rollout.engine=vllm runs in one process (each rank would start its own vLLM engine); use "
                "rollout.engine=local under torchrun / accelerate launch, or launch one process"
            )
        import_vllm()  # not installed / no GPU: one line before a model is loaded
    reward = build_reward(cfg.reward)
    records = read_prompts(cfg.data.prompts, cfg.data.image_folder or None)
    if isinstance(reward, BuiltinReward):
        reward.check([(r.where, r.record) for r in records])
    elif reward is None:  # labeler / rm:DIR: only the records' tasks to check
        yesno_rows(records)
    return records, reward


def train(
    cfg: GRPOFilesConfig,
    *,
    out_dir: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    records: list[Any] | None = None,
    reward: Any = None,
) -> dict[str, Any]:
    """Train; writes OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/, OUT/model (a complete model folder
    with its processor, LoRA merged; the LoRA itself in OUT/model/adapter). Returns a summary."""
    if records is None:
        records, reward = prepare(cfg)
    out, device = start_run(cfg.train, out_dir, global_batch=cfg.data.prompts_per_step)
    adapter = load_adapter(cfg.model.path, device=device, dtype=_dtype(cfg.model.dtype))
    if cfg.lora.enabled:
        adapter.apply_lora(r=cfg.lora.r, alpha=cfg.lora.alpha, dropout=cfg.lora.dropout,
                           target_modules=cfg.lora.target_modules)  # fmt: skip
    else:
        freeze_vision(adapter.model)
    adapter.model.train()
    ro = cfg.rollout
    spec = SamplingSpec(
        group_size=ro.group_size, max_new_tokens=ro.max_new_tokens, temperature=ro.temperature,
        top_p=ro.top_p, top_k=ro.top_k,
    )  # fmt: skip
    options: dict[str, Any] = {}
    if ro.engine == "vllm":
        options = dict(model_dir=cfg.model.path, gpu_memory_utilization=ro.vllm_gpu_memory_utilization,
                       max_model_len=ro.vllm_max_model_len, seed=cfg.train.seed)  # fmt: skip
    engine = build_engine(ro.engine, adapter, spec, **options)
    ref = Reference(model=adapter.model, needed=cfg.algo.beta > 0)
    opt, sched = make_optimizer(adapter.model, cfg.optim, cfg.train.steps)
    images = PromptImages(records)
    if reward is None:  # labeler / rm:DIR: built on the loaded device, before the policy changes
        reward = build_sourced_reward(
            cfg.reward, records=records, images=images, policy_folder=cfg.model.path, device=device
        )
    trainer = FilesGRPOTrainer(cfg, adapter, engine, ref, images, reward)

    def monitor(history: list[dict[str, Any]], record: dict[str, Any]) -> list[str]:
        return failure_warnings(history, record, max_new_tokens=ro.max_new_tokens)

    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=cfg.train, out=out, config=to_dict(cfg),
        desc="grpo-files" + ("-lora" if cfg.lora.enabled else ""), plot_keys=GRPO_PLOT_KEYS, monitor=monitor,
        grad_clip=cfg.optim.grad_clip, resume=resume, show_progress=show_progress,
    )  # fmt: skip
    if not result.stopped:  # rank 0 writes OUT; every rank returns once it is there
        common.on_rank0(lambda: trained_adapter(adapter, result.model).merge_and_save(out / "model"))
    return {
        "step": result.step,
        "prompts": len(records),
        "family": adapter.family,
        "engine": engine.name,
        "reference": ref.kind,
        "train_seconds": round(result.seconds, 3),
        "step_seconds": round(result.step_seconds, 4),
        "last": result.last,
    }
