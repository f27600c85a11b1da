"""The preference pair record every builder returns, and the caption pair they share.

A :class:`PreferencePair` is one JSONL line (:mod:`rl.pairs.files`); ``kind`` says which builder made it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from rl.rewards import score

PAIR_KINDS: tuple[str, ...] = ("injection", "onpolicy", "corrupt", "question", "correction", "colourfix")
"""Kinds of pairs the builders make."""


@dataclass(kw_only=True)
class PreferencePair:
    """One preference pair for DPO-family training on a note."""

    id: str
    """Unique pair id (``<note id>-<kind>-<i>``)."""
    kind: str
    """``injection``, ``onpolicy``, ``corrupt``, ``question`` or ``correction``."""
    note_id: str
    """Id of the note the pair is about."""
    images: list[str]
    """The note's image paths (relative to the note folder)."""
    prompt: str
    """The user prompt after the images."""
    chosen: str
    """Preferred response text."""
    rejected: str
    """Dispreferred response text (equal to ``chosen`` for a corrupt pair)."""
    objects: list[str] = field(default_factory=list)
    """Ground-truth categories of the note (for rewards and checks)."""
    chosen_ids: list[int] | None = None
    """Raw sampled token ids of ``chosen`` (on-policy pairs), else None (tokenise the text)."""
    rejected_ids: list[int] | None = None
    """Raw sampled token ids of ``rejected`` (on-policy pairs), else None."""
    chosen_reward: float | None = None
    """Reward of ``chosen`` (:func:`rl.rewards.score`), when computed."""
    rejected_reward: float | None = None
    """Reward of ``rejected``, when computed."""
    chosen_logp: float | None = None
    """Policy mean log-prob per token of ``chosen`` when the pair was built."""
    rejected_logp: float | None = None
    """Policy mean log-prob per token of ``rejected`` (with the corrupted images for a corrupt pair)."""
    corruption: dict[str, Any] | None = None
    """Corrupt pairs: :func:`rl.corrupt.corrupt` arguments (``kind``, ``seed``, ...) for the rejected side."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Builder details (injected object, edit mode, number of samples, ...)."""

    def __post_init__(self) -> None:
        if self.kind not in PAIR_KINDS:
            raise ValueError(f"pair {self.id!r}: kind must be one of {PAIR_KINDS}, got {self.kind!r}")
        if self.kind == "corrupt" and not self.corruption:
            raise ValueError(f"pair {self.id!r}: a corrupt pair needs its corruption spec")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> PreferencePair:
        if not isinstance(d, dict):
            raise ValueError(f"a pair must be a JSON object, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}; a pair has {sorted(names)}")
        for key in ("id", "kind", "note_id", "images", "prompt", "chosen", "rejected"):
            if key not in d:
                raise ValueError(f"pair is missing {key!r}")
        return cls(**d)


def caption_pair(
    note: Any, kind: str, prompt: str, chosen: str, rejected: str, reward_cfg: Any, meta: dict[str, Any]
) -> PreferencePair:
    """A caption pair about all of ``note``'s images, both sides scored against its objects."""
    objs = sorted(note.categories)
    return PreferencePair(
        id=f"{note.id}-{kind}-0",
        kind=kind,
        note_id=note.id,
        images=list(note.images),
        prompt=prompt,
        chosen=chosen,
        rejected=rejected,
        objects=objs,
        chosen_reward=score(chosen, objs, cfg=reward_cfg).total,
        rejected_reward=score(rejected, objs, cfg=reward_cfg).total,
        meta=meta,
    )
