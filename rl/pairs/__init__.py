"""Preference pairs against hallucination: one module per builder, each returning
:class:`~rl.pairs.record.PreferencePair` records.

- :mod:`rl.pairs.record`: the pair record, its kinds, and the scored caption pair builders share.
- :mod:`rl.pairs.files`: JSONL on disk (:func:`write_pairs` atomic, :func:`read_pairs` naming ``file:line``).
- :mod:`rl.pairs.importers`: your own pair files (native, RLAIF-V, RLHF-V records) for ``rl dpo --model``.
- :mod:`rl.pairs.injection`: an absent object added to or swapped into the true caption (POVID, HA-DPO).
- :mod:`rl.pairs.onpolicy`: best vs worst of sampled captions by reward (RLAIF-V).
- :mod:`rl.pairs.correction`: the policy's caption vs the same caption with its hallucinations
  replaced or cut (RLHF-V, HSA-DPO).
- :mod:`rl.pairs.colour_fix`: the policy's caption vs the same caption without the colours a judge
  rejects (the scene, a labeler, or the policy's own confidence).
- :mod:`rl.pairs.questions`: POPE-style yes/no answers, right vs wrong.
- :mod:`rl.pairs.corruption`: the same caption, rejected with corrupted images (mDPO).
- :mod:`rl.pairs.logps`: how on-policy a pair is (the policy's mean log-prob per token of each side).
- :mod:`rl.pairs.cli`: ``rl pairs``.

Every public name is re-exported here, loaded on first use (PEP 562) so that ``rl pairs --help`` does
not import torch: ``from rl.pairs import injection_pairs`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, tuple[str, ...]] = {
    "rl.pairs.record": ("PAIR_KINDS", "PreferencePair", "caption_pair"),
    "rl.pairs.files": ("read_pairs", "write_pairs"),
    "rl.pairs.importers": (
        "PAIR_FORMATS",
        "FilePair",
        "RecordError",
        "detect_format",
        "native_pair",
        "open_images",
        "read_pair_file",
        "rlaif_v_pair",
        "rlhf_v_pair",
    ),  # fmt: skip
    "rl.pairs.injection": ("ALSO_TEMPLATES", "choose_injected", "inject_object", "injection_pairs"),
    "rl.pairs.onpolicy": (
        "labeler_scorer",
        "onpolicy_pairs",
        "rank_pair",
        "sample_responses",
        "scene_scorer",
    ),  # fmt: skip
    "rl.pairs.correction": ("correction_pairs", "greedy_captions", "strip_objects"),
    "rl.pairs.colour_fix": (
        "colour_correction_pairs",
        "labeler_colour_judge",
        "scene_colour_judge",
        "self_colour_judge",
        "strip_colours",
    ),  # fmt: skip
    "rl.pairs.questions": ("question_pairs",),
    "rl.pairs.corruption": ("corrupt_pairs", "load_pixels", "pair_images"),
    "rl.pairs.logps": ("add_logps", "policy_logps"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'rl.pairs' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
