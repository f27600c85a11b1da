"""The starting policy from a model folder (``policy.init``), with a loaded NoteVLM's limits widened.

    adapter = load_policy("runs/sft/model", ["max_images=8", "max_length=1024"])

A NoteVLM trained on notes holds at most its ``max_images`` images and its processor's ``max_length``
tokens; an agent trajectory adds one image per zoom and grows past the note's prompt. ``policy.overrides``
on a loaded NoteVLM raise these two limits, never lower them (a value below the loaded one keeps the
loaded one; the other spec keys describe a random-init architecture and are errors with ``init``):

- ``max_images=N``: image slots per trajectory. Sound only where no weight is sized by the slot count
  (an image-scope fusion; image index embeddings only with ``image_index_embeddings=true`` below). The
  model is rebuilt from the widened config and the loaded weights must fit it exactly (a strict load);
  otherwise an error names the weights whose shape would change, so a widened model is the loaded one,
  weight for weight.
- ``max_length=N``: the processor's longest sequence, and the LM's ``max_position_embeddings`` raised to
  N where it is smaller (rotary positions hold no weights; learned position tables would fail the
  strict load above).
- ``image_index_embeddings=true``: give the model image index embeddings
  (``mm.multi_image.ImageIndexEmbedding``, one learned row per image slot added to that image's tokens,
  so "photo 2" need not be found by counting images) where it has none, or rows for the slots that
  ``max_images`` adds where it has some. The new rows are drawn fresh (N(0, 0.02^2), seeded by
  ``policy.seed``) and train with the rest; every loaded weight is kept as it was.

Other families load as saved (their limits are their own; overrides are an error).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from mm.errors import UserError
from mm.model.adapter.base import VLMAdapter
from rl.agent.backend import OBS_CLOSE, OBS_OPEN, USER_CLOSE, USER_OPEN
from rl.agent.parse import TOOL_CLOSE, TOOL_OPEN

INIT_OVERRIDES = ("max_images", "max_length", "image_index_embeddings")
"""The ``policy.overrides`` keys a loaded NoteVLM takes."""
FLAGS = ("image_index_embeddings",)
"""Of those, the ones that take true / false."""
INDEX_WEIGHT = "model.image_index.weight"
"""The image index embeddings' state-dict key: (max_images, D)."""
AGENT_TEXTS = (
    f'{TOOL_OPEN}{{"name": "zoom", "image": 2, "box": [0.25, 0.5, 0.75, 1.0]}}{TOOL_CLOSE}',
    f'{TOOL_OPEN}{{"name": "compare", "images": [1, 2]}}{TOOL_CLOSE}',
    f"{OBS_OPEN}zoom of photo 2:{OBS_CLOSE}",
    f"{USER_OPEN}No, I don't think so.{USER_CLOSE}",
)
"""Texts of the agent's format the policy's tokenizer must encode and decode unchanged."""


def parse_limits(overrides: Sequence[str]) -> dict[str, int | bool]:
    """``["max_images=8", "image_index_embeddings=true"]`` -> ``{"max_images": 8, "image_index_embeddings":
    True}``."""
    limits: dict[str, int | bool] = {}
    for item in overrides:
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or key not in INIT_OVERRIDES:
            raise UserError(
                f"policy.overrides entry {item!r} does not apply to a loaded model (policy.init): it takes "
                f"only {', '.join(k + ('=true' if k in FLAGS else '=N') for k in INIT_OVERRIDES)}; spec keys "
                "such as fusion.kind describe a random-init model, so drop them or drop policy.init"
            )
        if key in FLAGS:
            if value.lower() not in ("true", "false"):
                raise UserError(f"policy.overrides: {key} must be true or false, got {value!r}")
            limits[key] = value.lower() == "true"
            continue
        try:
            limits[key] = int(value)
        except ValueError:
            raise UserError(f"policy.overrides: {key} must be an integer, got {value!r}") from None
        if limits[key] < 1:
            raise UserError(f"policy.overrides: {key} must be >= 1, got {limits[key]}")
    return limits


def widen_notevlm(
    adapter: VLMAdapter,
    *,
    max_images: int | None = None,
    max_length: int | None = None,
    image_index_embeddings: bool = False,
    seed: int = 0,
):
    """A new NoteVLM adapter with the same weights and limits raised to at least the given ones (never
    lowered: a loaded model keeps what it was trained to read), and with ``image_index_embeddings`` fresh
    index rows for the slots that have none, drawn under ``seed`` (see the module docstring)."""
    from mm.model import NoteVLMForConditionalGeneration
    from mm.model.adapter.notevlm import NoteVLMAdapter

    base, proc = adapter.base_model, adapter.processor
    if base is not adapter.model:
        raise UserError("widen_notevlm takes a plain NoteVLM, not a PEFT-wrapped one; merge LoRA first")
    config = copy.deepcopy(base.config)
    proc = copy.copy(proc)
    if max_images is not None:
        config.max_images = proc.max_images = max(int(config.max_images), max_images)
    if max_length is not None:
        proc.max_length = max(int(proc.max_length), max_length)
        text = config.text_config
        if text.max_position_embeddings < proc.max_length:
            rope = dict(text.rope_parameters or {})
            if rope.get("rope_type", "default") != "default":
                raise UserError(
                    f"max_length={proc.max_length} is past the LM's max_position_embeddings "
                    f"({text.max_position_embeddings}) and its rotary scaling {rope.get('rope_type')!r} "
                    "depends on that value; lower max_length in policy.overrides (and rollout.max_length)"
                )
            text.max_position_embeddings = proc.max_length
    loaded = base.state_dict()
    if image_index_embeddings:
        config.image_index_embeddings = True
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = NoteVLMForConditionalGeneration(config)
        except ValueError as err:  # e.g. a note-scope fusion, whose tokens belong to no one image
            raise UserError(f"policy.overrides image_index_embeddings=true: {err}") from None
        loaded = with_fresh_index_rows(loaded, model.state_dict()[INDEX_WEIGHT])
    else:
        model = NoteVLMForConditionalGeneration(config)
    fresh = model.state_dict()
    reshaped = sorted(k for k in loaded.keys() & fresh.keys() if loaded[k].shape != fresh[k].shape)
    if reshaped or loaded.keys() != fresh.keys():
        moved = reshaped + sorted(loaded.keys() ^ fresh.keys())
        raise UserError(
            f"raising the loaded NoteVLM's limits to max_images={config.max_images}, "
            f"max_length={proc.max_length} would change its weights ({', '.join(moved[:4])}"
            f"{' ...' if len(moved) > 4 else ''}): image index embeddings, a note-scope fusion or learned "
            "positions are sized by these limits. Drop the override from policy.overrides, add "
            "image_index_embeddings=true to it (index rows for the new slots are then drawn fresh), or "
            "retrain the model with the larger limits"
        )
    model.load_state_dict(loaded, strict=True)
    model.generation_config = copy.deepcopy(base.generation_config)
    model.to(base.device).train(base.training)
    return NoteVLMAdapter(model=model, processor=proc)


def with_fresh_index_rows(loaded: dict[str, Any], fresh: torch.Tensor) -> dict[str, Any]:
    """``loaded`` (a NoteVLM state dict) with the index embedding table ``fresh`` (max_images, D) in place of
    its own, whose rows (one per slot it had) are kept over the fresh ones."""
    table = fresh.clone()
    own = loaded.get(INDEX_WEIGHT)
    if own is not None:
        if own.shape[0] > table.shape[0] or own.shape[1] != table.shape[1]:
            raise UserError(
                f"the loaded image index embeddings are {tuple(own.shape)}, which do not fit "
                f"{tuple(table.shape)}; keep the model's max_images and width"
            )
        table[: own.shape[0]] = own
    return {**loaded, INDEX_WEIGHT: table}


def check_agent_texts(tokenizer: Any) -> None:
    """A UserError unless ``tokenizer`` round-trips the agent's tool calls, observations and user turns."""
    for text in AGENT_TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        back = tokenizer.decode(ids, skip_special_tokens=True)
        if back != text:
            raise UserError(
                f"the policy's tokenizer does not encode the agent's format: {text!r} decodes as {back!r} "
                "(unknown characters or tags it treats as special tokens); use a byte-level tokenizer such "
                "as the project's (mm.data.tokenizer.load_tokenizer)"
            )


def load_policy(
    folder: str, overrides: Sequence[str], *, seed: int = 0, dtype: torch.dtype | None = None
) -> VLMAdapter:
    """The adapter of a model folder (on the CPU, in ``dtype``: None keeps the saved one), with a NoteVLM's
    limits raised by ``overrides`` (``key=N``; fresh index rows drawn under ``seed``)."""
    from mm.model.adapter.load import load_adapter

    adapter = load_adapter(folder, dtype=dtype)
    check_agent_texts(adapter.tokenizer)
    limits = parse_limits(overrides)
    if not limits:
        return adapter
    if adapter.family != "notevlm":
        raise UserError(
            f"policy.overrides {list(overrides)} apply to a NoteVLM; {folder} is a {adapter.family} model, "
            "whose limits are its own: set policy.overrides=[]"
        )
    return widen_notevlm(adapter, **limits, seed=seed)
