"""Rewards of ``rl grpo --prompts``: a built-in by name or any ``module:function``.

A reward is called once per completion as ``fn(prompt, completion, record) -> float``: ``prompt`` is
the record's question, ``completion`` the decoded completion (special tokens skipped, stripped) and
``record`` the prompt file's whole JSON object (its ``id``, ``image`` and any other field).

Built-ins (:data:`BUILTIN`), on the ground truth a record carries:

- ``chair``: the CHAIR-style caption reward of :func:`rl.rewards.score` (covered ground-truth objects
  minus hallucinated mentions, both over the number of objects) against the record's ``objects`` (a
  list of names, or one list per image), in ``reward.vocab``;
- ``yesno``: 1 when the parsed yes/no answer equals the record's ``answer`` (``yes``/``no``), else 0;
- ``hallucination``: ``yesno`` for records with an ``answer``, ``chair`` for the others.

Records are checked before the first rollout, so a missing field is one line naming the line number.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from mm.errors import UserError
from rl.rewards import RewardConfig, resolve_vocab, score

RewardFn = Callable[[str, str, dict[str, Any]], float]
"""``(prompt, completion, record) -> reward``."""

BUILTIN = ("hallucination", "chair", "yesno")
"""Built-in reward names."""


def record_objects(record: dict[str, Any]) -> list[str]:
    """A record's ground-truth object names: ``objects`` as a list of names or one list per image."""
    objs = record.get("objects")
    if not isinstance(objs, list):
        raise ValueError("objects must be a list of names (or one list of names per image)")
    flat = [o for x in objs for o in (x if isinstance(x, list) else [x])]
    if not all(isinstance(o, str) for o in flat):
        raise ValueError("objects must hold names (strings)")
    return flat


class BuiltinReward:
    """A built-in reward (:data:`BUILTIN`) with the weights of :class:`rl.rewards.RewardConfig`."""

    def __init__(self, name: str, cfg: RewardConfig) -> None:
        self.name, self.cfg = name, cfg

    def kind(self, record: dict[str, Any]) -> str:
        """``chair`` or ``yesno``: what this record is scored with."""
        if self.name == "hallucination":
            return "yesno" if "answer" in record else "chair"
        return self.name

    def check(self, records: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Every record carries the ground truth its kind needs (``records``: (where, record)); resolves
        ``vocab: auto`` from the ``objects`` of the chair records."""
        objects = []
        for where, rec in records:
            kind = self.kind(rec)
            try:
                if kind == "yesno":
                    ans = rec.get("answer")
                    if not isinstance(ans, str) or ans.strip().lower() not in ("yes", "no"):
                        raise ValueError(f"answer must be 'yes' or 'no', got {ans!r}")
                else:
                    if "objects" not in rec:
                        raise ValueError("no objects: the chair reward needs the image's object names")
                    objects.append(record_objects(rec))
            except ValueError as e:
                raise UserError(f"{where}: reward {self.name!r} ({kind}): {e}") from None
        if objects:
            vocab = resolve_vocab(self.cfg.vocab, objects, where="the prompt file")
            self.cfg = replace(self.cfg, vocab=vocab)

    def __call__(self, prompt: str, completion: str, record: dict[str, Any]) -> float:
        return self.score(completion, record).total

    def score(self, completion: str, record: dict[str, Any]) -> Any:
        """The :class:`rl.rewards.Reward` (total and components) of one completion."""
        if self.kind(record) == "yesno":
            return score(completion, [], label=record["answer"].strip().lower(), cfg=self.cfg)
        return score(completion, record_objects(record), cfg=self.cfg)


def import_reward(spec: str) -> RewardFn:
    """``module:function`` -> the function, importable from the current folder or ``PYTHONPATH``; it must
    take ``(prompt, completion, record)``. Every failure is a one-line :class:`UserError`."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UserError(
            f"reward {spec!r} is neither a built-in ({', '.join(BUILTIN)}) nor module:function "
            "(e.g. my_rewards:length_penalty)"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(
            f"reward {spec!r}: cannot import module {module_name!r} ({e}); put it in the current folder "
            "or on PYTHONPATH"
        ) from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        what = "has no" if fn is None else "has a non-callable"
        raise UserError(f"reward {spec!r}: module {module_name!r} {what} {attr!r}; name a function in it")
    try:
        inspect.signature(fn).bind("prompt", "completion", {})
    except TypeError as e:
        raise UserError(
            f"reward {spec!r} must take (prompt: str, completion: str, record: dict) and return a float: {e}"
        ) from None
    except ValueError:  # no signature to inspect (a builtin): trust it
        pass
    return fn


def build_reward(cfg: Any) -> Any:
    """The reward of ``cfg`` (:class:`rl.trainers.grpo_files_config.FilesRewardConfig`): a
    :class:`BuiltinReward` or an imported function (checked before anything is written); None for the
    ground-truth-free ``labeler`` / ``rm:DIR``, which need a loaded model
    (:func:`rl.trainers.grpo_files_sourced.build_sourced_reward`)."""
    if cfg.fn in BUILTIN:
        weights = {k: getattr(cfg, k) for k in RewardConfig.__dataclass_fields__}
        return BuiltinReward(cfg.fn, RewardConfig(**weights))
    if cfg.fn == "labeler" or cfg.fn.startswith("rm:"):
        if cfg.fn.startswith("rm:") and not os.path.isdir(cfg.fn[3:]):
            raise UserError(
                f"reward {cfg.fn!r}: reward model folder {cfg.fn[3:]!r} not found (train one: rl rm)"
            )
        return None  # built by rl.trainers.grpo_files_sourced once the model is loaded
    return import_reward(cfg.fn)


def call_reward(fn: Any, prompt: str, completion: str, record: dict[str, Any]) -> float:
    """``fn(prompt, completion, record)`` as a float; a non-number or NaN is a one-line error."""
    value = fn(prompt, completion, record)
    if not isinstance(value, numbers.Real) or math.isnan(float(value)):
        name = getattr(fn, "__name__", repr(fn))
        raise UserError(f"reward {name} returned {value!r} ({type(value).__name__}); it must return a float")
    return float(value)
