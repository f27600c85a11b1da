"""rl: post-training a NoteVLM against hallucination (DPO family, GRPO/DAPO), on top of :mod:`mm`.

- Pure math, golden-tested, re-exported here: :mod:`rl.logprobs` (token log-probs with response
  masks), :mod:`rl.losses` (DPO family, mDPO terms, clipped policy/value losses, aggregation),
  :mod:`rl.advantages` (GRPO/RLOO/GAE, whitening), :mod:`rl.kl` (k1/k2/k3, entropy),
  :mod:`rl.sampling` (DAPO dynamic sampling, overlong penalty).
- :mod:`rl.rewards`: hallucination rewards from the ground-truth objects (CHAIR matching, yes/no answers).
- :mod:`rl.corrupt`: image corruptions for mDPO's conditional term.
- :mod:`rl.pairs`: preference pairs, one module per builder (injection, on-policy, correction,
  questions, corruption), JSONL files, policy log-probs; the ``rl pairs`` CLI.
- :mod:`rl.trainers`: the DPO and GRPO trainers and the batched rollout sampler they share.
- :mod:`rl.pipeline` (the main job: data -> pretrain -> SFT -> eval -> DPO/GRPO -> eval) and
  :mod:`rl.report` (its metrics, report and plots); :mod:`rl.cli` (the ``rl`` command line).

Import rule: ``rl`` may import ``mm``; ``mm`` never imports ``rl``. The names below load on first use
(PEP 562) so that ``rl --help`` does not import torch: ``from rl import dpo_loss`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, tuple[str, ...]] = {
    "rl.advantages": (
        "ADVANTAGE_SCALES",
        "gae",
        "group_advantages",
        "group_reward_std",
        "masked_mean",
        "masked_var",
        "masked_whiten",
        "rloo_advantages",
    ),
    "rl.kl": ("KL_KINDS", "entropy_from_logits", "kl_estimate"),
    "rl.logprobs": ("causal_token_logprobs", "sequence_logprob", "token_logprobs"),
    "rl.losses": (
        "AGG_MODES",
        "DPO_LOSS_TYPES",
        "aggregate_loss",
        "bco_running_delta",
        "dpo_loss",
        "mdpo_anchor_loss",
        "mdpo_conditional_loss",
        "policy_loss",
        "value_loss",
    ),
    "rl.sampling": ("FilledGroups", "fill_groups", "informative_groups", "overlong_penalty"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
