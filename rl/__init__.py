"""rl package: post-training against hallucination.

The math lives in small pure modules, re-exported here lazily (PEP 562) so that ``rl --help`` does
not import torch: ``rl.logprobs`` (token log-probs with response masks), ``rl.losses`` (DPO family,
mDPO terms, clipped policy/value losses, aggregation), ``rl.advantages`` (GRPO/RLOO/GAE,
whitening), ``rl.kl`` (k1/k2/k3, entropy) and ``rl.sampling`` (DAPO dynamic sampling, overlong
penalty). ``from rl import dpo_loss`` works as usual.
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
