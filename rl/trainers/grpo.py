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
   the reference (:func:`rl.kl.kl_estimate`, k3 by default, as GRPO eq. 4).

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from rl.rewards import RewardConfig
from rl.trainers.common import (
    InitConfig,
    LoraConfig,
    OptimConfig,
    Reference,
    RunConfig,
    batch_token_logps,
    note_pixels,
)

GRPO_PLOT_KEYS = ["loss", "reward_mean", "zero_std_frac", "entropy", "kl", "response_len", "clip_frac_high"]
"""Panels of OUT/curves.png."""


PROMPT_KINDS = ("caption", "question", "pope_question")
"""What :class:`PromptSet` can ask."""


@dataclass(kw_only=True)
class DataConfig:
    """Prompts: captions and/or yes/no object questions about the notes of a split."""

    folder: str = "runs/data/world"
    """Note folder (notes.jsonl + images)."""
    split: str = "train"
    """Split the prompts come from."""
    notes: int = 0
    """Use the first n notes with objects (0 = all)."""
    tasks: list[str] = field(default_factory=lambda: ["caption"])
    """Prompt kinds: caption (scene reward), question (the notes' yes/no questions) and/or pope_question
    (POPE-style questions about one image, adversarial negatives: mm.train.tasks.pope_question_samples);
    questions get the yes/no reward."""
    caption_prompt: str = "Describe the note."
    """The captioning prompt (the SFT one)."""
    questions_per_note: int = 2
    """Most yes/no questions per note used as prompts (of each question kind)."""
    prompts_per_step: int = 4
    """Prompts (groups) per step; the batch is prompts_per_step * group_size responses."""

    def __post_init__(self) -> None:
        bad = [t for t in self.tasks if t not in PROMPT_KINDS]
        if bad or not self.tasks:
            raise ValueError(
                f"data.tasks must be a non-empty subset of {list(PROMPT_KINDS)}, got {self.tasks}"
            )
        if self.prompts_per_step < 1 or self.notes < 0 or self.questions_per_note < 0:
            raise ValueError("need data.prompts_per_step >= 1, data.notes >= 0, data.questions_per_note >= 0")


@dataclass(kw_only=True)
class RolloutConfig:
    """Sampling of the responses."""

    group_size: int = 8
    """G: responses per prompt."""
    max_new_tokens: int = 64
    """Longest response; longer ones are cut (truncated)."""
    temperature: float = 1.0
    """Sampling temperature (the log-probs use the same)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    sampler: str = "inverse_cdf"
    """How a token is drawn (``rl.trainers.rollout.SAMPLERS``): ``inverse_cdf`` (fast, the same
    distribution) or ``multinomial`` (exactly HF ``generate``'s tokens for the same seed)."""

    def __post_init__(self) -> None:
        from rl.trainers.rollout import SAMPLERS

        if self.sampler not in SAMPLERS:
            raise ValueError(f"rollout.sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.group_size < 2:
            raise ValueError(
                f"rollout.group_size must be >= 2 (a group needs a baseline), got {self.group_size}"
            )
        if self.max_new_tokens < 1 or self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError("need rollout.max_new_tokens >= 1, temperature > 0 and 0 < top_p <= 1")


@dataclass(kw_only=True)
class AlgoConfig:
    """Advantages, the clipped loss, KL and DAPO options."""

    advantage: str = "grpo"
    """grpo (group mean baseline, scaled by `scale`) or rloo (leave-one-out baseline)."""
    scale: str = "group"
    """GRPO advantage scaling: group (std of the group), batch (std of the batch) or none (Dr. GRPO)."""
    eps_low: float = 0.2
    """Lower clip range: ratio >= 1 - eps_low."""
    eps_high: float = 0.2
    """Upper clip range: ratio <= 1 + eps_high (DAPO clip-higher: 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (verl clip_ratio_c = 3); null = off."""
    level: str = "token"
    """Importance ratio per token (GRPO) or per sequence (GSPO)."""
    agg: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""
    beta: float = 0.0
    """KL weight to the reference (0 = no reference model at all, as DAPO / Dr. GRPO)."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2, k3 or low_var_kl."""
    num_iterations: int = 1
    """Updates per rollout batch (mu); > 1 computes old log-probs before the first update."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop all-equal-reward groups and sample more prompts to fill the batch."""
    max_sample_batches: int = 4
    """Dynamic sampling budget: prompt batches sampled per step at most."""
    overlong_penalty: bool = False
    """DAPO soft overlong penalty added to the reward."""
    overlong_cache: int = 16
    """Length of the penalty window before max_new_tokens (tokens)."""
    overlong_factor: float = 1.0
    """Penalty at max_new_tokens (reward - factor)."""
    mention_credit: float = 0.0
    """Weight of the dense per-mention credit (:func:`rl.rewards.mention_credits`: the caption reward
    spread over the words that earned it) added to each caption token's advantage, in reward units
    (0 = off, plain GRPO; needs ``level: token``)."""

    def __post_init__(self) -> None:
        from rl.advantages import ADVANTAGE_SCALES
        from rl.kl import KL_KINDS
        from rl.losses import AGG_MODES

        checks = [
            (
                self.advantage in ("grpo", "rloo"),
                f"algo.advantage must be grpo or rloo, got {self.advantage!r}",
            ),
            (
                self.scale in ADVANTAGE_SCALES,
                f"algo.scale must be one of {ADVANTAGE_SCALES}, got {self.scale!r}",
            ),
            (
                self.level in ("token", "sequence"),
                f"algo.level must be token or sequence, got {self.level!r}",
            ),
            (self.agg in AGG_MODES, f"algo.agg must be one of {AGG_MODES}, got {self.agg!r}"),
            (self.kl_estimator in KL_KINDS, f"algo.kl_estimator must be one of {KL_KINDS}"),
            (
                0 <= self.eps_low < 1 and self.eps_high >= 0,
                "need 0 <= algo.eps_low < 1 and algo.eps_high >= 0",
            ),
            (
                self.dual_clip is None or self.dual_clip > 1,
                f"algo.dual_clip must be > 1, got {self.dual_clip}",
            ),
            (self.beta >= 0, f"algo.beta (KL weight) must be >= 0, got {self.beta}"),
            (
                self.num_iterations >= 1 and self.max_sample_batches >= 1,
                "need num_iterations, max_sample_batches >= 1",
            ),
            (self.overlong_cache >= 1, f"algo.overlong_cache must be >= 1, got {self.overlong_cache}"),
            (self.mention_credit >= 0, f"algo.mention_credit must be >= 0, got {self.mention_credit}"),
            (
                self.mention_credit == 0 or self.level == "token",
                "algo.mention_credit gives token-level advantages: it needs algo.level=token",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(kw_only=True)
class GRPOConfig:
    """Everything ``rl grpo`` needs."""

    init: InitConfig = field(default_factory=InitConfig)
    """SFT checkpoint to start from."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA (reference = adapters off) or full fine-tuning (reference = frozen copy)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantages, loss, KL, DAPO options."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Hallucination reward weights (rl.rewards.RewardConfig)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: RunConfig = field(default_factory=RunConfig)
    """Steps, seed, cadence."""

    def __post_init__(self) -> None:
        if self.algo.overlong_penalty and self.algo.overlong_cache > self.rollout.max_new_tokens:
            raise ValueError(
                f"algo.overlong_cache={self.algo.overlong_cache} must be <= rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens}"
            )


# ---------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Prompt:
    """One prompt: which note, the text after the images, and the yes/no label (None for a caption)."""

    note: int
    """Index into the prompt set's notes."""
    text: str
    """User prompt after the images."""
    label: str | None
    """``yes``/``no`` for an object question; None for a caption."""
    image: int | None = None
    """The one image of the note the prompt shows (pope_question); None = all of them."""


class PromptSet:
    """Prompts over notes held in memory (uint8 images), encoded once per (images, prompt)."""

    def __init__(self, *, processor: Any, notes: list[Any], root: str | Path, cfg: DataConfig) -> None:
        from mm.train.sft_data import load_note_images

        self.processor = processor
        self.notes = notes
        self.objects = [sorted(n.categories) for n in notes]
        self.prompts: list[Prompt] = []
        pope = None
        if "pope_question" in cfg.tasks:
            from mm.train.tasks import pope_question_samples

            pope = pope_question_samples(notes, per_note=cfg.questions_per_note)
        for i, n in enumerate(notes):
            if "caption" in cfg.tasks:
                self.prompts.append(Prompt(i, cfg.caption_prompt, None))
            if "question" in cfg.tasks:
                qs = n.questions[: cfg.questions_per_note]
                self.prompts.extend(Prompt(i, q.question, q.answer) for q in qs)
            if pope is not None:  # answers in the word style: the label
                self.prompts.extend(Prompt(i, s.prompt, s.answer, image=s.image) for s in pope[i])
        if not self.prompts:
            raise UserError(
                f"no prompts: the notes give no {cfg.tasks} prompts; check data.tasks and the notes"
            )
        self.images = load_note_images(notes, root, processor.image_size)

    def __len__(self) -> int:
        return len(self.prompts)

    def _images(self, prompt: Prompt) -> torch.Tensor:
        """uint8 images the prompt shows (n, 3, S, S): the note's, or its one image."""
        imgs = self.images[prompt.note]
        return imgs if prompt.image is None else imgs[prompt.image : prompt.image + 1]

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Left-padded prompt batch (input_ids, attention_mask, pixel_values, image_mask)."""
        p = self.processor
        items = [
            p.encode_pixels(note_pixels(self._images(self.prompts[i]), p), self.prompts[i].text)
            for i in indices
        ]
        return p.collate(items, padding_side="left")


def score_rollout(
    texts: list[str], prompts: list[Prompt], objects: list[list[str]], cfg: RewardConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rewards ``(B*G,)`` of decoded responses (``prompts``/``objects`` per response) and component means."""
    from rl.rewards import batch_scores

    totals, comps = batch_scores(texts, objects, labels=[p.label for p in prompts], cfg=cfg)
    means = {}
    for k, v in comps.items():
        vals = [x for x in v if x == x]
        if vals:
            means[f"reward_{k}"] = sum(vals) / len(vals)
    return torch.tensor(totals, dtype=torch.float32), means


def token_credits(roll: Any, rows: list[Prompt], objects: list[list[str]], tok: Any, reward: RewardConfig):
    """``(B*G, R)`` float32: :func:`rl.rewards.mention_credits` of each caption row's sampled tokens
    (``rows[i]``: row i's prompt; ``objects``: ground truth per note), 0 on question rows and padding.
    Token texts come from the raw ids one id at a time (no re-tokenisation)."""
    from rl.rewards import mention_credits

    P = roll.prompt_length
    out = torch.zeros(roll.input_ids.shape[0], roll.input_ids.shape[1] - P)
    texts: dict[int, str] = {}
    for i, (ids, prompt) in enumerate(zip(roll.response_ids(), rows)):
        if prompt.label is not None or not ids:
            continue
        pieces = [texts.setdefault(t, tok.decode([t], skip_special_tokens=True)) for t in ids]
        out[i, : len(ids)] = torch.tensor(mention_credits(pieces, objects[prompt.note], reward))
    return out


# ---------------------------------------------------------------- the step


def compute_advantages(rewards: torch.Tensor, *, group_size: int, cfg: AlgoConfig) -> torch.Tensor:
    """``(B*G,)`` advantages of group-major rewards (GRPO with ``cfg.scale``, or RLOO)."""
    from rl.advantages import group_advantages, rloo_advantages

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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy loss (+ ``beta`` * KL) of one rollout batch, and detached metrics.

    ``batch``: a rollout batch (:meth:`rl.trainers.rollout.Rollout.batch`; NoteVLM or text-only LM);
    ``advantages`` ``(B,)``; ``old_logps`` / ``ref_logps`` ``(B, W)`` from :func:`batch_token_logps`
    on the same batch (``old_logps=None``: the current ones detached, a single update per rollout).
    """
    from rl.kl import kl_estimate
    from rl.losses import aggregate_loss, policy_loss

    logps, mask, entropy = batch_token_logps(
        model, batch, temperature=temperature, with_entropy=True
    )  # (B, W)
    old = logps.detach() if old_logps is None else old_logps
    loss, metrics = policy_loss(
        logps, old, advantages.to(logps.dtype), mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
        dual_clip=cfg.dual_clip, level=cfg.level, agg=cfg.agg, horizon=horizon,
    )  # fmt: skip
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


def train(
    cfg: GRPOConfig,
    *,
    out_dir: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train; writes OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/, OUT/model. Returns a summary."""
    from mm.config import to_dict
    from mm.data.format import read_notes
    from mm.train import common as C
    from rl.advantages import group_reward_std
    from rl.sampling import fill_groups, informative_groups, overlong_penalty
    from rl.trainers.common import (
        clip_and_norm,
        load_policy,
        make_optimizer,
        save_final,
        start_run,
        to_device,
        train_loop,
    )
    from rl.trainers.monitor import failure_warnings
    from rl.trainers.rollout import generate_rollout, merge_rollouts

    out, device = start_run(cfg.train, out_dir)
    folder = Path(cfg.data.folder)
    if not (folder / "notes.jsonl").is_file():
        raise UserError(f"data.folder={folder} has no notes.jsonl; generate notes with `mm data world`")
    notes = [n for n in read_notes(folder, split=cfg.data.split) if n.categories]
    notes = notes[: cfg.data.notes] if cfg.data.notes else notes
    if not notes:
        raise UserError(f"data.folder={folder}: no {cfg.data.split!r} notes with object annotations")
    model, processor = load_policy(cfg.init, cfg.lora, device)
    ref = Reference(model=model, needed=cfg.algo.beta > 0)
    prompts = PromptSet(processor=processor, notes=notes, root=folder, cfg=cfg.data)
    opt, sched = make_optimizer(model, cfg.optim, cfg.train.steps)
    tok = processor.tokenizer
    G, B, ro, algo = cfg.rollout.group_size, cfg.data.prompts_per_step, cfg.rollout, cfg.algo
    model.train()

    def sample(
        step: int, k: int
    ) -> tuple[list[tuple[Any, int, list[Prompt]]], torch.Tensor, dict[str, float]]:
        idx = C.batch_indices(len(prompts), B, seed=cfg.train.seed, step=step * algo.max_sample_batches + k)
        batch = to_device(prompts.batch(idx), device)
        roll = generate_rollout(
            model, batch, group_size=G, max_new_tokens=ro.max_new_tokens, eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id, temperature=ro.temperature, top_p=ro.top_p, sampler=ro.sampler,
        )  # fmt: skip
        row_prompts = [prompts.prompts[i] for i in idx for _ in range(G)]
        texts = [tok.decode(r, skip_special_tokens=True).strip() for r in roll.response_ids()]
        objects = [prompts.objects[p.note] for p in row_prompts]
        rewards, comps = score_rollout(texts, row_prompts, objects, cfg.reward)
        if algo.overlong_penalty:
            rewards = rewards + overlong_penalty(
                roll.lengths.cpu(), max_length=ro.max_new_tokens, cache_length=algo.overlong_cache,
                factor=algo.overlong_factor,
            )  # fmt: skip
        groups = [(roll, g, row_prompts[g * G : (g + 1) * G]) for g in range(len(idx))]
        return groups, rewards.view(len(idx), G), comps

    def step_fn(step: int) -> dict[str, Any]:
        seen: list[torch.Tensor] = []
        comps_seen: list[dict[str, float]] = []
        calls = iter(range(algo.max_sample_batches))

        def sample_fn() -> tuple[list[Any], torch.Tensor]:
            groups, rewards, comps = sample(step, next(calls))
            seen.append(rewards)
            comps_seen.append(comps)
            return groups, rewards

        if algo.dynamic_sampling:
            filled = fill_groups(sample_fn, target_groups=B, max_batches=algo.max_sample_batches)
            groups, rewards = filled.groups, filled.rewards
        else:
            groups, rewards = sample_fn()
        sampled = torch.cat(seen)  # (groups sampled, G)
        first = groups[0][0]
        if all(r is first for r, _, _ in groups) and [g for _, g, _ in groups] == list(range(len(groups))):
            roll = first  # every group of one sampling batch, in order: merging would copy it unchanged
        else:
            roll = merge_rollouts(
                [(r, list(range(g * G, (g + 1) * G))) for r, g, _ in groups], pad_id=tok.pad_token_id
            )
        flat = rewards.reshape(-1)  # (B*G,)
        adv = compute_advantages(flat, group_size=G, cfg=algo).to(device)
        credit = None
        if algo.mention_credit > 0:
            rows = [p for _, _, ps in groups for p in ps]
            credit = token_credits(roll, rows, prompts.objects, tok, cfg.reward).to(device)  # (B*G, R)
            adv = adv[:, None] + algo.mention_credit * credit  # (B*G, R) per-token advantages
        batch = to_device(roll.batch(), device)
        with torch.no_grad():
            old = None
            if algo.num_iterations > 1:
                old = batch_token_logps(model, batch, temperature=ro.temperature)[0]
            ref_logps = ref.token_logps(batch, temperature=ro.temperature) if ref.kind != "none" else None
        for _ in range(algo.num_iterations):
            loss, metrics = grpo_loss(
                model, batch, adv, algo, old_logps=old, ref_logps=ref_logps, temperature=ro.temperature,
                horizon=ro.max_new_tokens,
            )  # fmt: skip
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = clip_and_norm(model, cfg.optim.grad_clip)
            opt.step()
        sched.step()
        comps = {
            k: sum(c[k] for c in comps_seen if k in c) / sum(k in c for c in comps_seen)
            for k in comps_seen[0]
        }
        return {
            "loss": float(loss.detach()),
            "grad_norm": grad_norm,
            "reward_mean": float(flat.mean()),
            "reward_std": float(flat.std()),
            "zero_std_frac": float((~informative_groups(sampled)).float().mean()),
            "group_reward_std": float(group_reward_std(flat, group_size=G).mean()),
            "adv_std": float(adv.std()),
            "clip_frac_low": float(metrics["clip_frac_low"]),
            "clip_frac_high": float(metrics["clip_frac_high"]),
            "clip_frac_dual": float(metrics["clip_frac_dual"]),
            "approx_kl": float(metrics["approx_kl"]),
            **({"kl": float(metrics["kl"])} if "kl" in metrics else {}),
            "entropy": float(metrics["entropy"]),
            "response_len": float(roll.lengths.float().mean()),
            "truncated_frac": float(roll.truncated.float().mean()),
            "sample_batches": len(seen),
            **({"mention_credit_abs": float(credit.abs().sum(-1).mean())} if credit is not None else {}),
            **comps,
        }

    def monitor(history: list[dict[str, Any]], record: dict[str, Any]) -> list[str]:
        return failure_warnings(history, record, max_new_tokens=ro.max_new_tokens)

    result = train_loop(
        out=out, config=to_dict(cfg), model=model, optimizer=opt, scheduler=sched, run=cfg.train,
        step_fn=step_fn, desc="grpo" + ("-lora" if cfg.lora.enabled else ""), state={},
        plot_keys=GRPO_PLOT_KEYS, monitor=monitor, resume=resume, show_progress=show_progress,
        stop_after=stop_after,
    )  # fmt: skip
    if stop_after is None or result.step < stop_after:
        save_final(model, processor, out, lora=cfg.lora.enabled)
    return {
        "step": result.step,
        "prompts": len(prompts),
        "reference": ref.kind,
        "train_seconds": round(result.seconds, 3),
        "step_seconds": round(result.step_seconds, 4),
        "last": result.last,
    }
