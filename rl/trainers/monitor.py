"""Known RL failure patterns, read off the per-step metrics (pure functions of the metric history).

The most common questions in TRL/verl trackers, each turned into a warning that says why:

- ``zero-std``: every group's rewards are equal, so every advantage is 0 and the policy loss is 0
  (TRL issue "GRPO loss is 0"). Only the KL term (if any) moves the weights.
- ``entropy-collapse``: mean token entropy fell below ``entropy_ratio`` of its first logged value: the
  policy became near-deterministic, groups will soon all agree (then zero-std) and exploration stops.
- ``length-runaway``: mean response length grew past ``length_ratio`` times its first value, or most
  responses hit ``max_new_tokens`` (often a reward that pays for length, or a loss aggregation that
  favours long answers, e.g. ``seq-mean-token-mean`` on negative advantages).

Each message starts with its kind and a colon, so a trainer can raise each kind once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def failure_warnings(
    history: Sequence[dict[str, Any]],
    record: dict[str, Any],
    *,
    max_new_tokens: int | None = None,
    entropy_ratio: float = 0.1,
    length_ratio: float = 2.0,
    truncated_frac: float = 0.5,
) -> list[str]:
    """Warnings for ``record`` (this step's metrics) given the earlier ``history`` (oldest first)."""
    out = []
    first = next((h for h in history if "entropy" in h), None)
    if record.get("zero_std_frac") == 1.0:
        out.append(
            "zero-std: every group has equal rewards, so all advantages and the policy loss are 0 "
            "(the 'GRPO loss is 0' pattern): the prompts are too easy/hard or the reward is constant; "
            "raise the group size or temperature, change the reward, or enable dynamic sampling"
        )
    if first is not None and "entropy" in record and first["entropy"] > 0:
        if record["entropy"] < entropy_ratio * first["entropy"]:
            out.append(
                f"entropy-collapse: token entropy {record['entropy']:.4f} is below {entropy_ratio:g} x its "
                f"first value {first['entropy']:.4f}; lower the learning rate, raise clip_high (DAPO "
                "clip-higher) or the KL weight"
            )
    first_len = next((h for h in history if "response_len" in h), None)
    if first_len is not None and "response_len" in record and first_len["response_len"] > 0:
        if record["response_len"] > length_ratio * first_len["response_len"]:
            out.append(
                f"length-runaway: mean response length {record['response_len']:.1f} is over {length_ratio:g} "
                f"x its first value {first_len['response_len']:.1f}; check that the reward is length-neutral "
                "and consider the overlong penalty or token-mean aggregation"
            )
    if max_new_tokens is not None and record.get("truncated_frac", 0.0) > truncated_frac:
        out.append(
            f"length-runaway: {record['truncated_frac']:.0%} of responses hit "
            f"max_new_tokens={max_new_tokens}; "
            "enable the overlong penalty or raise max_new_tokens"
        )
    return out
