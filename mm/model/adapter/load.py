"""`load_adapter`: a model folder (or a loaded model + processor) -> the right `VLMAdapter`.

    adapter = load_adapter("runs/sft/model")                   # NoteVLM folder -> NoteVLMAdapter
    adapter = load_adapter("models/llava-1.5-7b-hf", device="cuda", dtype="bfloat16")  # transformers

Folders only (never hub ids): download a checkpoint first, e.g.
``huggingface-cli download llava-hf/llava-1.5-7b-hf --local-dir models/llava-1.5-7b-hf``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from mm.model.adapter.base import VLMAdapter

NOTEVLM_TYPE = "notevlm"


def _dtype(dtype: Any) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise UserError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    return value


def _model_type(folder: Path) -> str:
    if not folder.is_dir():
        raise UserError(
            f"{folder} is not a folder: load_adapter takes local model folders only (no hub ids); download "
            "one first, e.g. `huggingface-cli download REPO --local-dir DIR`"
        )
    path = folder / "config.json"
    if not path.is_file():
        raise UserError(f"{path} not found: {folder} is not a saved transformers model folder")
    model_type = json.loads(path.read_text()).get("model_type")
    if not model_type:
        raise UserError(f"{path} has no model_type; is it a transformers model config?")
    return str(model_type)


def load_adapter(
    path_or_model: str | Path | Any,
    processor: Any = None,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
) -> VLMAdapter:
    """The adapter for a folder (NoteVLM -> `NoteVLMAdapter`, else `TransformersAdapter`) or a model.

    Args:
        path_or_model: a local model folder, or a loaded model (a PeftModel is kept as is).
        processor: the model's processor: required with a loaded model, not allowed with a folder.
        device: where the model runs.
        dtype: weights' dtype (``None`` = as saved; ``"bfloat16"``, ``torch.float16`` ...).
    """
    from mm.model.adapter.hf import TransformersAdapter
    from mm.model.adapter.notevlm import NoteVLMAdapter

    dtype = _dtype(dtype)
    if isinstance(path_or_model, (str, Path)):
        folder = Path(path_or_model)
        if processor is not None:
            raise UserError("pass a processor only with a loaded model; a folder brings its own processor")
        if _model_type(folder) == NOTEVLM_TYPE:
            return NoteVLMAdapter.from_folder(folder, device=device, dtype=dtype)
        return TransformersAdapter.from_folder(folder, device=device, dtype=dtype)
    if processor is None:
        raise UserError(
            f"load_adapter got a {type(path_or_model).__name__} without its processor; pass processor="
        )
    model = path_or_model.to(device)
    if dtype is not None:
        model = model.to(dtype)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if base.config.model_type == NOTEVLM_TYPE:
        return NoteVLMAdapter(model=model, processor=processor)
    return TransformersAdapter(model=model, processor=processor)
