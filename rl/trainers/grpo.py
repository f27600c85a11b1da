"""GRPO / DAPO / GSPO post-training of a NoteVLM with hallucination rewards (``rl grpo``).

One step (GRPO, Shao et al. 2024, "DeepSeekMath", Algorithm 1, outcome supervision):

1. take ``prompts_per_step`` prompts (a caption request or a yes/no object question about a note)
   and sample ``group_size`` responses each, batched with the KV cache (:mod:`rl.trainers.rollout`);
2. score every response against the note's scene (:func:`rl.rewards.score`: covered objects minus
   hallucinated mentions, or yes/no correctness), plus DAPO's soft overlong penalty when enabled;
   with DAPO dynamic sampling (Yu et al. 2025, sec. 3.2) drop groups whose rewards are all equal and
   sample more prompts until the batch is full (:func:`rl.sampling.fill_groups`);
3. advantages per group (``group``/``batch``/``none`` std scaling, Dr. GRPO; or RLOO);
4. ``num_iterations`` updates of the clipped surrogate (:func:`rl.losses.policy_loss`: clip-higher,
   dual clip, token or sequence (GSPO) ratios, loss aggregation) plus ``beta`` times the KL estimate to
   the reference (:func:`rl.kl.kl_estimate`, k3 by default, as GRPO eq. 4). When the sampler's
   distribution is not the trainer's ``softmax(logits / T)`` (``top_p < 1``, ``top_k > 0``, or a
   generation-config processor), each token's loss is weighted by the truncated importance weight
   ``min(pi_old / pi_sampling, rollout.tis_cap)`` (:mod:`rl.importance`); otherwise nothing changes.

The same step on any model folder and a prompt file is :mod:`rl.trainers.grpo_files`.

Why a compact loop and not TRL's ``GRPOTrainer``: TRL 1.16 builds prompts through
``processor.apply_chat_template`` + ``processor(images=..., text=...)`` and passes flat per-image
``pixel_values``/``image_grid_thw`` (Qwen-VL conventions); NoteVLM takes ``(B, N, 3, S, S)`` pixels
with an ``image_mask`` and a processor of a different signature, and TRL's rewards see decoded text
only, while the scene reward here needs each prompt's ground-truth objects. The loop below is ~100
lines on the tested pure functions; :func:`grpo_loss` also takes a text-only causal LM batch, which
is how ``benchmarks/rl_bench.py`` times it against ``GRPOTrainer``.

Deviations: with ``num_iterations == 1`` the old log-probs are the current ones detached (ratio 1, as
TRL); the learning-rate schedule advances once per rollout step (not per inner update); log-probs use
the unprocessed logits at the sampling temperature (a token NoteVLM suppresses at generation keeps its
mass, as TRL/verl ignore logits processors too).

Data parallel (torchrun / accelerate launch; :mod:`rl.trainers.grpo_shard`): each rank samples whole
groups, its contiguous shard of every sampling batch's prompts, each prompt from a generator seeded by
``(seed, step, sampling batch, position)`` (:mod:`rl.rollout.seeded`), so 1 and N processes draw the same
completions; rewards are all-gathered, so advantages (``scale: batch`` too), DAPO dynamic sampling and the
logged metrics are the global batch's; the loss is normalised by the global token (or sequence) count and
the gradients are averaged by :mod:`mm.train.loop`. Only rank 0 writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mm.config import to_dict
from mm.errors import UserError
from mm.train import common, loop
from mm.train.common import rank_world
from rl.advantages import group_advantages, rloo_advantages
from rl.entropy import REMEDY_KEYS, remedied_policy_loss
from rl.importance import truncated_is_weights, weighted_advantages
from rl.kl import kl_estimate
from rl.losses import aggregate_loss
from rl.rewards import RewardConfig, batch_scores, colour_term, mention_credits
from rl.rollout.seeded import prompt_generators, prompt_seed
from rl.sampling import overlong_penalty
from rl.trainers.common import (
    Reference,
    batch_token_logps,
    load_policy,
    make_optimizer,
    save_final,
    start_run,
    to_device,
)
from rl.trainers.grpo_config import PROMPT_KINDS, AlgoConfig, DataConfig, GRPOConfig, RolloutConfig
from rl.trainers.grpo_data import Prompt, PromptSet, load_prompt_notes
from rl.trainers.grpo_shard import (
    AGG_BY_TOKENS,
    collect_groups,
    counts,
    gather_rewards,
    global_counts,
    local_rows,
    loss_weight,
    shard_positions,
    step_metrics,
)
from rl.trainers.monitor import failure_warnings
from rl.trainers.rewarders import build_rewarder
from rl.trainers.rollout import decode_loop_supported, generate_rollout, merge_rollouts

__all__ = [
    "PROMPT_KINDS", "AlgoConfig", "DataConfig", "GRPOConfig", "GRPOTrainer", "Prompt", "PromptSet",
    "RolloutConfig", "compute_advantages", "grpo_loss", "score_rollout", "token_credits", "train",
]  # fmt: skip

GRPO_PLOT_KEYS = ["loss", "reward_mean", "zero_std_frac", "entropy", "kl", "response_len", "clip_frac_high"]
"""Panels of OUT/curves.png."""


def score_rollout(
    texts: list[str], prompts: list[Prompt], objects: list[list[str]], cfg: RewardConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rewards ``(B*G,)`` of decoded responses (``prompts``/``objects`` per response) and component means."""
    totals, comps = batch_scores(texts, objects, labels=[p.label for p in prompts], cfg=cfg)
    means = {}
    for k, v in comps.items():
        vals = [x for x in v if x == x]
        if vals:
            means[f"reward_{k}"] = sum(vals) / len(vals)
    return torch.tensor(totals, dtype=torch.float32), means


def token_credits(
    roll: Any,
    rows: list[Prompt],
    objects: list[list[str]],
    tok: Any,
    reward: RewardConfig,
    truths: list[Any] | None = None,
):
    """``(B*G, R)`` float32: :func:`rl.rewards.mention_credits` of each caption row's sampled tokens
    (``rows[i]``: row i's prompt; ``objects``: ground truth per note; ``truths``: colour truth per note,
    when the reward judges colours: :func:`rl.rewards.colour_term`), 0 on question rows and padding.
    Token texts come from the raw ids one id at a time (no re-tokenisation)."""
    P = roll.prompt_length
    out = torch.zeros(roll.input_ids.shape[0], roll.input_ids.shape[1] - P)
    texts: dict[int, str] = {}
    for i, (ids, prompt) in enumerate(zip(roll.response_ids(), rows)):
        if prompt.label is not None or not ids:
            continue
        pieces = [texts.setdefault(t, tok.decode([t], skip_special_tokens=True)) for t in ids]
        truth = None if truths is None else truths[prompt.note]
        out[i, : len(ids)] = torch.tensor(mention_credits(pieces, objects[prompt.note], reward, truth))
    return out


# ---------------------------------------------------------------- the step


def compute_advantages(rewards: torch.Tensor, *, group_size: int, cfg: AlgoConfig) -> torch.Tensor:
    """``(B*G,)`` advantages of group-major rewards (GRPO with ``cfg.scale``, or RLOO)."""
    if cfg.advantage == "rloo":
        return rloo_advantages(rewards, group_size=group_size)
    return group_advantages(rewards, group_size=group_size, scale=cfg.scale)


def grpo_loss(
    model: Any,
    batch: dict[str, torch.Tensor],
    advantages: torch.Tensor,
    cfg: AlgoConfig,
    *,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    temperature: float = 1.0,
    horizon: int | None = None,
    is_weights: torch.Tensor | None = None,
    scorer: Callable[..., Any] = batch_token_logps,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy loss (+ ``beta`` * KL) of one rollout batch, and detached metrics.

    ``batch``: a rollout batch (:meth:`rl.trainers.rollout.Rollout.batch`; NoteVLM or text-only LM);
    ``advantages`` ``(B,)`` or ``(B, W)``; ``old_logps`` / ``ref_logps`` ``(B, W)`` from ``scorer`` on the
    same batch (``old_logps=None``: the current ones detached, a single update per rollout).
    ``is_weights`` ``(B, W)``: truncated importance weights of a rollout sampled off the trainer's
    distribution (:mod:`rl.importance`), applied to each token's clipped loss. ``scorer``:
    ``(model, batch, temperature=, with_entropy=) -> (logps, mask, entropy)`` (default
    :func:`batch_token_logps`; ``rl grpo --prompts`` passes the adapter's).
    """
    logps, mask, entropy = scorer(model, batch, temperature=temperature, with_entropy=True)  # (B, W)
    old = logps.detach() if old_logps is None else old_logps
    adv = advantages.to(logps.dtype)
    if is_weights is not None:
        adv = weighted_advantages(adv, is_weights)  # (B, W): w_t * loss_t == loss_t(w_t * A)
    loss, metrics = remedied_policy_loss(logps, old, adv, mask, entropy, cfg, horizon=horizon)
    m = mask.to(logps.dtype)
    if cfg.beta > 0:
        if ref_logps is None:
            raise ValueError("algo.beta > 0 needs ref_logps (the reference model's log-probs)")
        kl = kl_estimate(logps, ref_logps, kind=cfg.kl_estimator)  # (B, W)
        loss = loss + cfg.beta * aggregate_loss(kl, mask, mode=cfg.agg, horizon=horizon)
        metrics["kl"] = ((kl.detach() * m).sum() / m.sum().clamp(min=1)).detach()
    metrics["entropy"] = (entropy * m).sum() / m.sum().clamp(min=1)
    metrics["policy_loss"] = loss.detach()
    return loss, metrics


# ---------------------------------------------------------------- training


class GRPOTrainer(loop.StepTrainer):
    """A step's batch is a scored, advantage-weighted rollout; its loss is :func:`grpo_loss`, run
    ``algo.num_iterations`` times on the same rollout."""

    def __init__(
        self, cfg: GRPOConfig, model: Any, ref: Reference, prompts: PromptSet, tok: Any, device: torch.device,
        rewarder: Any = None,
    ) -> None:  # fmt: skip
        self.cfg, self.model, self.ref, self.prompts, self.tok, self.device = (
            cfg,
            model,
            ref,
            prompts,
            tok,
            device,
        )
        self.policy = model
        """The model that samples (``rl ppo``'s trainer trains a policy-and-critic module around it)."""
        self.updates_per_step = cfg.algo.num_iterations
        self.rewarder = rewarder
        """None: the scene reward; else ``reward.source``'s (:func:`rl.trainers.rewarders.build_rewarder`)."""
        self.reward_without_colour = dataclasses.replace(
            cfg.reward, attribute_weight=0.0, attribute_coverage_weight=0.0
        )
        """The scene reward of each caption with ``algo.colour_in_sequence`` false (colours in the credit)."""
        self.rank, self.world = rank_world()
        self.positions = shard_positions(cfg.data.prompts_per_step, rank=self.rank, world=self.world)
        """This rank's positions in every sampling batch of prompts (whole groups)."""
        ro = cfg.rollout
        self.off_policy_sampling = not (ro.top_p == 1.0 and ro.top_k == 0 and decode_loop_supported(model))
        """The sampler's distribution is not the trainer's softmax(logits / T): record its log-probs and
        weight the loss by truncated importance sampling (:mod:`rl.importance`)."""

    def _sample(self, step: int, k: int) -> tuple[list[Any], torch.Tensor, dict[str, tuple[float, float]]]:
        """Sampling batch ``k`` of ``step``: this rank's groups (None for the other ranks' positions), the
        global ``(B, G)`` rewards and this rank's reward components as ``(sum, count)``."""
        cfg, ro, tok = self.cfg, self.cfg.rollout, self.tok
        G, B = ro.group_size, cfg.data.prompts_per_step
        idx = common.batch_indices(
            len(self.prompts), B, seed=cfg.train.seed, step=step * cfg.algo.max_sample_batches + k
        )
        mine = [idx[p] for p in self.positions]
        seeds = [prompt_seed(cfg.train.seed, step, k, p) for p in self.positions]
        batch = to_device(self.prompts.batch(mine), self.device)
        roll = generate_rollout(
            self.policy, batch, group_size=G, max_new_tokens=ro.max_new_tokens, eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id, temperature=ro.temperature, top_p=ro.top_p, sampler=ro.sampler,
            top_k=ro.top_k, record_logps=self.off_policy_sampling,
            generators=prompt_generators(seeds, self.device),
        )  # fmt: skip
        row_prompts = [self.prompts.prompts[i] for i in mine for _ in range(G)]
        texts = [tok.decode(r, skip_special_tokens=True).strip() for r in roll.response_ids()]
        if self.rewarder is None:
            objects = [self.prompts.objects[p.note] for p in row_prompts]
            labels = [p.label for p in row_prompts]
            note_truths = self._truths() if cfg.algo.colour_in_sequence else None
            truths = None if note_truths is None else [note_truths[p.note] for p in row_prompts]
            reward = cfg.reward if note_truths is not None else self.reward_without_colour
            totals, parts = batch_scores(texts, objects, labels=labels, cfg=reward, truths=truths)
            rewards = torch.tensor(totals, dtype=torch.float32)
            comps = {
                f"reward_{k}": (sum(x for x in v if x == x), sum(x == x for x in v)) for k, v in parts.items()
            }
            # (sum, count) of each reward component over the rows it applies to (NaN elsewhere)
        else:
            rewards, means = self.rewarder.score(texts, row_prompts)
            comps = {k: (v * len(texts), len(texts)) for k, v in means.items()}  # means over every row
        if cfg.algo.overlong_penalty:
            rewards = rewards + overlong_penalty(
                roll.lengths.cpu(), max_length=ro.max_new_tokens, cache_length=cfg.algo.overlong_cache,
                factor=cfg.algo.overlong_factor,
            )  # fmt: skip
        groups: list[Any] = [None] * B
        for g, p in enumerate(self.positions):
            groups[p] = (roll, g, row_prompts[g * G : (g + 1) * G])
        return groups, gather_rewards(rewards.view(len(mine), G), world=self.world), comps

    def credits(self, roll: Any, rows: list[Prompt]) -> torch.Tensor:
        """``(b*G, R)`` dense per-mention credits of the rollout's rows (``rows[i]``: row i's prompt), from
        the scene (:func:`token_credits`) or the rewarder's claims."""
        if self.rewarder is None:
            return token_credits(roll, rows, self.prompts.objects, self.tok, self.cfg.reward, self._truths())
        return self.rewarder.credits(roll, rows, self.tok)

    def _truths(self) -> list[Any] | None:
        """Per-note colour truth when the scene reward judges colours (:func:`rl.rewards.colour_term`)."""
        if not colour_term(self.cfg.reward):
            return None
        return self.prompts.truths(self.cfg.reward.vocab)

    def batch(self, step: int) -> dict[str, Any]:
        """This rank's rows of the rollout of ``step`` with their advantages (from the global batch's
        rewards), reference / old log-probs, loss weights and the global rollout metrics."""
        algo, ro, G = self.cfg.algo, self.cfg.rollout, self.cfg.rollout.group_size
        kept, rewards, groups, weighted, seen, stats = collect_groups(
            lambda k: self._sample(step, k), dynamic=algo.dynamic_sampling,
            target_groups=self.cfg.data.prompts_per_step, max_batches=algo.max_sample_batches,
        )  # fmt: skip
        first = groups[0][0]
        in_order = [g for _, g, _ in groups] == list(range(first.input_ids.shape[0] // G))
        if in_order and all(r is first for r, _, _ in groups):
            roll = first  # every group of one sampling batch, in order: merging would copy it unchanged
        else:
            roll = merge_rollouts(
                [(r, list(range(g * G, (g + 1) * G))) for r, g, _ in groups], pad_id=self.tok.pad_token_id
            )
        flat = rewards.reshape(-1)  # (B*G,) the global batch's kept rewards
        adv_all = compute_advantages(flat, group_size=G, cfg=algo)  # (B*G,)
        adv = adv_all[local_rows(kept, G)] if weighted else torch.zeros(G)
        adv = adv.to(self.device)
        credit = None
        if algo.mention_credit > 0:
            credit = self.credits(roll, [p for _, _, ps in groups for p in ps]).to(self.device)
            adv = adv[:, None] + algo.mention_credit * credit  # (b*G, R) per-token advantages
        batch = to_device(roll.batch(), self.device)
        with torch.no_grad():
            old = weights = None
            if algo.num_iterations > 1 or roll.rollout_logps is not None:
                old, mask, _ = batch_token_logps(self.model, batch, temperature=ro.temperature)
            if roll.rollout_logps is not None:  # (b*G, R) == (b*G, W): responses start at column P
                mu = roll.rollout_logps.to(old.device)
                weights = truncated_is_weights(old, mu, mask, cap=ro.tis_cap, level=ro.tis_level)
            ref_logps = None
            if self.ref.kind != "none":
                ref_logps = self.ref.token_logps(batch, temperature=ro.temperature)
        local = counts(roll.response_mask, weighted=weighted)
        total = global_counts(local, world=self.world)
        n = len(roll.lengths) if weighted else 0
        stats["response_len"] = (float(roll.lengths.sum()) if weighted else 0.0, n)
        stats["truncated_frac"] = (float(roll.truncated.sum()) if weighted else 0.0, n)
        if credit is not None:
            stats["mention_credit_abs"] = (float(credit.abs().sum()) if weighted else 0.0, n)
        metrics = step_metrics(
            rewards=flat, advantages=adv_all, sampled=seen, group_size=G, stats=stats, weights=weights,
            mask=mask if weights is not None and weighted else None, tis_cap=ro.tis_cap, world=self.world,
        )  # fmt: skip
        out = {"rows": batch, "adv": adv, "old": old, "ref": ref_logps, "weights": weights}
        return {**out, "metrics": metrics, "counts": (local, total)}

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        ro = self.cfg.rollout
        loss, m = grpo_loss(
            self.model, batch["rows"], batch["adv"], self.cfg.algo, old_logps=batch["old"],
            ref_logps=batch["ref"], temperature=ro.temperature, horizon=ro.max_new_tokens,
            is_weights=batch["weights"],
        )  # fmt: skip
        return shard_loss(loss, m, batch, self.cfg.algo, self.world)


def shard_loss(
    loss: torch.Tensor, m: dict[str, torch.Tensor], batch: dict[str, Any], algo: AlgoConfig, world: int
) -> tuple[torch.Tensor, dict[str, Any]]:
    """This rank's share of the global batch's loss and metrics (:mod:`rl.trainers.grpo_shard`): the loss
    and the token- (or sequence-) averaged metrics weighted by ``local count * world / global count``, so
    that the skeleton's mean over ranks (of the gradients and of the logged values) is the global batch's.
    Single-process the weights are exactly 1."""
    (tokens, seqs), (all_tokens, all_seqs) = batch["counts"]
    by_tokens = loss_weight(tokens, all_tokens, world=world)
    by_seqs = loss_weight(seqs, all_seqs, world=world)
    w_loss = by_tokens if algo.agg in AGG_BY_TOKENS else by_seqs
    w_clip = by_tokens if algo.level == "token" else by_seqs
    keys = ("clip_frac_low", "clip_frac_high", "clip_frac_dual")
    return loss * w_loss, {
        **batch["metrics"],
        **{k: float(m[k]) * w_clip for k in keys},
        **{k: float(m[k]) * by_tokens for k in ("approx_kl", "kl", "entropy", *REMEDY_KEYS) if k in m},
    }


def train(
    cfg: GRPOConfig,
    *,
    out_dir: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train; writes OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/, OUT/model (rank 0). Returns a
    summary. Under torchrun / accelerate launch each rank samples its shard of every step's prompts."""
    out, device = start_run(cfg.train, out_dir, global_batch=cfg.data.prompts_per_step)
    folder = Path(cfg.data.folder)
    if not (folder / "notes.jsonl").is_file():
        raise UserError(f"data.folder={folder} has no notes.jsonl; generate notes with `mm data world`")
    # with data.ground_truth false the notes come stripped of their ground truth (rl.ground_truth)
    notes, vocab = load_prompt_notes(folder, cfg.data, source=cfg.reward.source, vocab=cfg.reward.vocab)
    cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, vocab=vocab))
    model, processor = load_policy(cfg.init, cfg.lora, device)
    ref = Reference(model=model, needed=cfg.algo.beta > 0)
    prompts = PromptSet(processor=processor, notes=notes, root=folder, cfg=cfg.data)
    opt, sched = make_optimizer(model, cfg.optim, cfg.train.steps)
    rewarder = build_rewarder(
        cfg.reward, policy_folder=cfg.init.model, prompts=prompts, root=folder, device=device,
        colour_in_sequence=cfg.algo.colour_in_sequence,
    )  # fmt: skip
    trainer = GRPOTrainer(cfg, model, ref, prompts, processor.tokenizer, device, rewarder)

    def monitor(history: list[dict[str, Any]], record: dict[str, Any]) -> list[str]:
        return failure_warnings(history, record, max_new_tokens=cfg.rollout.max_new_tokens)

    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=cfg.train, out=out, config=to_dict(cfg),
        desc="grpo" + ("-lora" if cfg.lora.enabled else ""), plot_keys=GRPO_PLOT_KEYS, monitor=monitor,
        grad_clip=cfg.optim.grad_clip, resume=resume, show_progress=show_progress, stop_after=stop_after,
    )  # fmt: skip
    if not result.stopped:  # rank 0 writes OUT; every rank returns once it is there
        common.on_rank0(lambda: save_final(result.model, processor, out, lora=cfg.lora.enabled))
    return {
        "step": result.step,
        "prompts": len(prompts),
        "reference": ref.kind,
        "train_seconds": round(result.seconds, 3),
        "step_seconds": round(result.step_seconds, 4),
        "last": result.last,
    }
