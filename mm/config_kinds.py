"""The registry of config kinds: which dataclass a YAML file is, and which command takes it.

    cls = config_class("sft")                       # mm.train.sft.TrainConfig
    kind, how = guess_kind("configs/rl/grpo.yaml")  # ("grpo", "guessed from the file name")

Classes are named as ``"module:Class"`` strings and imported only when asked for, so this is the one
place that knows where each config class lives (``mm config show`` and its tests read it). The ``rl``
kinds are looked up by name, lazily: ``mm`` never imports ``rl`` at import time.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm.config import ConfigError


@dataclass(frozen=True)
class Kind:
    """One kind of config file."""

    target: str
    """``"module:Class"`` of its dataclass."""
    command: str
    """The command (or function) that takes it."""


KINDS: dict[str, Kind] = {
    "world": Kind("mm.world.config:WorldConfig", "mm data world --config FILE"),
    "notevlm": Kind("mm.model.factory:NoteVLMSpec", "mm.model.factory.load_notevlm_spec(FILE) (Python)"),
    "pretrain": Kind("mm.train.pretrain:PretrainConfig", "mm pretrain --config FILE"),
    "train": Kind("mm.train.sft:TrainConfig", "mm train --config FILE (train.stage align or sft)"),
    "compare": Kind("mm.train.compare:CompareConfig", "mm compare-fusion --config FILE"),
    "pope": Kind("mm.eval.pope:PopeBuildConfig", "mm eval pope-build (its flags)"),
    "dpo": Kind("rl.trainers.dpo:DPOConfig", "rl dpo --config FILE"),
    "dpo_files": Kind("rl.trainers.dpo_config:FilesDPOConfig", "rl dpo --model DIR --pairs FILE"),
    "grpo": Kind("rl.trainers.grpo:GRPOConfig", "rl grpo --config FILE"),
    "grpo_files": Kind(
        "rl.trainers.grpo_files_config:GRPOFilesConfig", "rl grpo --model DIR --prompts P.jsonl --config FILE"
    ),
    "ppo": Kind("rl.trainers.ppo_config:PPOConfig", "rl ppo --config FILE"),
    "pairs": Kind("rl.pairs.cli:PairsConfig", "rl pairs (its flags)"),
    "rm": Kind("rl.trainers.rm_config:RMConfig", "rl rm --model DIR --pairs FILE"),
    "distill": Kind("rl.trainers.distill_config:DistillConfig", "rl distill --student DIR --teacher DIR"),
    "pipeline": Kind("rl.pipeline:PipelineConfig", "rl pipeline --config FILE"),
    "agent": Kind("rl.agent.config:AgentRunConfig", "rl agent --config FILE"),
}
"""Kind name -> its dataclass and command."""

ALIASES: dict[str, str] = {"sft": "train", "align": "train"}
"""Other names accepted by ``--kind``."""

ALSO_DOCUMENTED: tuple[str, ...] = ("mm.multi_image:MultiImageConfig", "rl.rewards:RewardConfig")
"""Config dataclasses built in code rather than from a file; their fields are documented all the same."""

NAME_HINTS: tuple[tuple[str, str], ...] = (
    ("pipeline", "pipeline"), ("grpo_files", "grpo_files"), ("grpo", "grpo"), ("dapo", "grpo"),
    ("dpo_files", "dpo_files"), ("dpo", "dpo"), ("pretrain", "pretrain"), ("compare", "compare"),
    ("align", "train"), ("sft", "train"), ("world", "world"), ("notevlm", "notevlm"), ("pairs", "pairs"),
    ("pope", "pope"), ("distill", "distill"), ("ppo", "ppo"), ("agent", "agent"),
)  # fmt: skip
"""(word in the file name, kind), tried in order: "grpo_files" before "grpo" before "dpo" (each contains the
next)."""


def _import(target: str) -> type:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def kind_name(kind: str) -> str:
    """The registered name of ``kind`` (aliases resolved); unknown kinds raise :class:`ConfigError`."""
    name = ALIASES.get(kind, kind)
    if name not in KINDS:
        known = ", ".join([*KINDS, *ALIASES])
        raise ConfigError(f"unknown config kind {kind!r}; known kinds: {known}")
    return name


def config_class(kind: str) -> type:
    """The dataclass of ``kind`` (a name of :data:`KINDS` or :data:`ALIASES`)."""
    return _import(KINDS[kind_name(kind)].target)


def all_classes() -> list[type]:
    """Every registered top-level config dataclass, then :data:`ALSO_DOCUMENTED`."""
    return [_import(k.target) for k in KINDS.values()] + [_import(t) for t in ALSO_DOCUMENTED]


def _fields(kind: str) -> set[str]:
    import dataclasses

    return {f.name for f in dataclasses.fields(config_class(kind)) if f.init}


def _fits(kind: str, keys: set[str]) -> bool:
    return keys <= _fields(kind)


def guess_kind(path: str | Path, data: dict[str, Any] | None = None) -> tuple[str, str]:
    """``(kind, how it was guessed)`` for a config file: from a word of its file name when the file's
    top-level keys fit that kind, else from the keys alone when exactly one kind accepts them all, or when
    one of the kinds that do has no section the others lack (``rl grpo``'s config inside ``rl ppo``'s)."""
    keys = set(data or {})
    stem = Path(path).stem.lower()
    for word, kind in NAME_HINTS:
        if word in stem and _fits(kind, keys):
            return kind, f"guessed from the file name ({word!r} in {Path(path).name})"
    fitting = [k for k in KINDS if _fits(k, keys)]
    inner = [k for k in fitting if all(_fields(k) <= _fields(o) for o in fitting)]
    if len(inner) == 1:  # one kind's sections all belong to each other fitting kind (grpo's to ppo's)
        fitting = inner
    if len(fitting) == 1:
        shown = ", ".join(sorted(keys)[:6]) + (", ..." if len(keys) > 6 else "")
        return fitting[0], f"guessed from the top-level keys: {shown}"
    which = f"kinds {', '.join(fitting)} all accept" if fitting else "no kind accepts"
    raise ConfigError(
        f"cannot tell the kind of {path}: {which} its top-level keys {sorted(keys)}; pass --kind "
        f"(one of {', '.join(KINDS)})"
    )
