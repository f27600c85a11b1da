"""On-policy ranked pairs (RLAIF-V, Yu et al. 2024).

Sample several captions per note from the current model (the GRPO rollout sampler,
:func:`rl.trainers.rollout.generate_rollout`), score them with :func:`rl.rewards.score` against the
scene (or with any ``scorer``: :func:`labeler_scorer` asks a labeler VLM and never reads the scene),
keep best vs worst, skip ties. The sampled token ids are kept in the pair (never decoded and
re-tokenised).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mm.data.images import open_rgb
from mm.errors import UserError
from mm.eval.claims import note_truth
from mm.eval.generate import note_images
from rl.pairs.record import PreferencePair
from rl.rewards import RewardConfig, colour_term, score, vocabulary
from rl.trainers.rollout import generate_rollout


def _trim(ids: list[int], eos: int, pad: int | None) -> list[int]:
    if eos in ids:
        return ids[: ids.index(eos) + 1]
    while ids and pad is not None and pad != eos and ids[-1] == pad:
        ids = ids[:-1]
    return ids


def sample_responses(
    model: Any,
    processor: Any,
    notes: Sequence[Any],
    root: str | Path,
    *,
    prompt: str,
    num_samples: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 96,
    batch_size: int = 16,
    seed: int = 0,
) -> list[list[tuple[str, list[int]]]]:
    """``num_samples`` sampled ``(text, raw token ids)`` per note (batched, KV cache, seeded), drawn by
    :func:`rl.trainers.rollout.generate_rollout` (the GRPO rollout: one prefill per note, a lean decode
    step, an inverse-CDF sampler)."""

    if num_samples < 2:
        raise UserError(f"on-policy pairs need num_samples >= 2 to rank, got {num_samples}")
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    tok = processor.tokenizer
    out: list[list[tuple[str, list[int]]]] = []
    for start in range(0, len(notes), batch_size):
        chunk = notes[start : start + batch_size]
        batch = processor([note_images(n, root) for n in chunk], [prompt] * len(chunk), padding_side="left")
        batch = {k: v.to(device) for k, v in batch.items()}
        roll = generate_rollout(
            model, batch, group_size=num_samples, max_new_tokens=max_new_tokens, eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id, temperature=temperature, top_p=top_p,
        )  # fmt: skip  # (b * num_samples, P + R), note-major
        new = roll.response_ids()
        for j in range(len(chunk)):
            group = new[j * num_samples : (j + 1) * num_samples]
            rows = [_trim(r, tok.eos_token_id, tok.pad_token_id) for r in group]
            out.append([(tok.decode(r, skip_special_tokens=True).strip(), r) for r in rows])
    return out


Scorer = Callable[[Any, Sequence[str]], list[float]]
"""``(note, sampled captions) -> one reward per caption``."""


def scene_scorer(reward_cfg: Any = None) -> Scorer:
    """Rewards from the note's ground-truth objects (:func:`rl.rewards.score`), and from its colours
    (:func:`mm.eval.claims.note_truth`) when the reward judges colours (:func:`rl.rewards.colour_term`)."""
    cfg = reward_cfg or RewardConfig()

    def scorer(note: Any, texts: Sequence[str]) -> list[float]:
        truth = note_truth(note, vocabulary(cfg.vocab)) if colour_term(cfg) else None
        return [score(t, sorted(note.categories), cfg=cfg, truth=truth).total for t in texts]

    return scorer


def labeler_scorer(labeler: Any, root: str | Path, reward_cfg: Any = None) -> Scorer:
    """Rewards from a labeler's verdicts on each caption's claims (:mod:`rl.labeler_reward`: supported
    claims minus unsupported ones), the note's images read from ``root``; no ground truth is read."""

    from rl.labeler_reward import caption_claims, claim_values, colour_claims, colour_values

    cfg = reward_cfg or RewardConfig()
    vocab = vocabulary(cfg.vocab)
    colours = colour_term(cfg)
    cw = {
        "attribute_weight": cfg.attribute_weight,
        "attribute_coverage_weight": cfg.attribute_coverage_weight,
    }

    def scorer(note: Any, texts: Sequence[str]) -> list[float]:
        images = [open_rgb(p) for p in note_images(note, root)]
        claims = sorted({c for t in texts for c in caption_claims(t, vocab)})
        support = {c: labeler.supported(p) for c, p in labeler.verify_objects(images, claims).items()}
        w = {"coverage_weight": cfg.coverage_weight, "hallucination_weight": cfg.hallucination_weight}
        values = [sum(claim_values([c for _, c in vocab.mentions(t)], support, **w)) for t in texts]
        if not colours:
            return values
        facts = [[(o, c) for _, o, c in colour_claims(t, cfg.vocab)] for t in texts]
        asked = sorted({f"{c} {o}" for fs in facts for o, c in fs})
        p = labeler.verify_objects(images, asked)  # "red fork" -> P(yes) of "Is there a red fork ...?"
        colour_support = {(o, c): labeler.supported(p[f"{c} {o}"]) for fs in facts for o, c in fs}
        return [v + sum(colour_values(fs, support, colour_support, **cw)) for v, fs in zip(values, facts)]

    return scorer


def rank_pair(texts: Sequence[str], rewards: Sequence[float]) -> tuple[int, int] | None:
    """``(best, worst)`` indices by reward (first of equals), or None when all rewards tie."""
    if len(texts) != len(rewards) or len(texts) < 2:
        raise ValueError(
            f"need >= 2 texts with one reward each, got {len(texts)} texts, {len(rewards)} rewards"
        )
    best = max(range(len(rewards)), key=lambda i: (rewards[i], -i))
    worst = min(range(len(rewards)), key=lambda i: (rewards[i], i))
    if rewards[best] == rewards[worst]:
        return None
    return best, worst


def onpolicy_pairs(
    model: Any,
    processor: Any,
    notes: Sequence[Any],
    root: str | Path,
    *,
    prompt: str,
    num_samples: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 96,
    batch_size: int = 16,
    seed: int = 0,
    reward_cfg: Any = None,
    scorer: Scorer | None = None,
) -> list[PreferencePair]:
    """RLAIF-V-style pairs: per note, the best vs the worst of ``num_samples`` sampled captions by reward
    (``scorer``: default :func:`scene_scorer` of ``reward_cfg``). Pairs ranked without ground truth carry
    no ``objects``."""
    rank = scorer or scene_scorer(reward_cfg)
    samples = sample_responses(
        model, processor, notes, root, prompt=prompt, num_samples=num_samples, temperature=temperature,
        top_p=top_p, max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed,
    )  # fmt: skip
    out = []
    for note, group in zip(notes, samples):
        rewards = rank(note, [t for t, _ in group])
        ranked = rank_pair([t for t, _ in group], rewards)
        if ranked is None:
            continue
        b, w = ranked
        out.append(
            PreferencePair(
                id=f"{note.id}-onpolicy-0",
                kind="onpolicy",
                note_id=note.id,
                images=list(note.images),
                prompt=prompt,
                chosen=group[b][0],
                rejected=group[w][0],
                objects=sorted(note.categories) if scorer is None else [],
                chosen_ids=group[b][1],
                rejected_ids=group[w][1],
                chosen_reward=rewards[b],
                rejected_reward=rewards[w],
                meta={"num_samples": num_samples, "temperature": temperature, "rewards": rewards},
            )
        )
    return out
