"""`load_adapter`: a model folder (or a loaded model + processor) -> the right `VLMAdapter`.

    adapter = load_adapter("runs/sft/model")                   # NoteVLM folder -> NoteVLMAdapter
    adapter = load_adapter("models/llava-1.5-7b-hf", device="cuda", dtype="bfloat16")  # transformers

Folders only (never hub ids): download a checkpoint first, e.g.
``huggingface-cli download llava-hf/llava-1.5-7b-hf --local-dir models/llava-1.5-7b-hf``.

A PEFT adapter folder (``adapter_config.json`` and the adapter's weights, what TRL's trainers and
``PeftModel.save_pretrained`` write under LoRA) loads too: its base model (the config's
``base_model_name_or_path``, a local folder) is loaded, the adapter put on it and merged, so every command
sees one plain model. The processor comes from the adapter folder when it holds one (TRL saves it there),
else from the base's.
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
        if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
            return _peft_folder(folder, device=device, dtype=dtype)
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


def _peft_folder(folder: Path, *, device: str | torch.device, dtype: torch.dtype | None) -> VLMAdapter:
    """A PEFT adapter folder on its local base model, merged (module docstring)."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict

    config = json.loads((folder / "adapter_config.json").read_text())
    base = config.get("base_model_name_or_path")
    where = Path(base) if base else None
    if where is not None and not where.is_absolute() and not where.is_dir():
        where = folder / base  # a path relative to the adapter folder
    if where is None or not (where / "config.json").is_file():
        raise UserError(
            f"{folder} is a PEFT adapter whose base model {base!r} is not a local model folder; download the "
            "base (`huggingface-cli download REPO --local-dir DIR`) and set base_model_name_or_path in "
            f"{folder / 'adapter_config.json'} to that folder"
        )
    adapter = load_adapter(where, device=device, dtype=dtype)
    try:
        peft = PeftModel.from_pretrained(adapter.model, str(folder))
    except (ValueError, RuntimeError, KeyError) as e:
        why = " ".join(str(e).split())[:300]
        raise UserError(f"{folder}: the PEFT adapter does not fit its base {where} ({why})") from None
    saved, used = _adapter_keys(folder), set(get_peft_model_state_dict(peft))
    if saved is not None and saved != used:  # PEFT only warns: the adapter's weights would be left out
        unused = sorted(saved - used)
        raise UserError(
            f"{folder}: the PEFT adapter does not fit its base {where}: {len(unused)} of its {len(saved)} "
            f"tensors name no module there (e.g. {unused[:2]}); set base_model_name_or_path to the model it "
            "was trained on"
        )
    processor = adapter.processor
    if adapter.family == NOTEVLM_TYPE and (folder / "note_processor.json").is_file():
        from mm.model import NoteProcessor

        processor = NoteProcessor.from_pretrained(folder)
    elif any((folder / f).is_file() for f in ("processor_config.json", "preprocessor_config.json")):
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
    return load_adapter(peft.merge_and_unload().eval(), processor, device=device, dtype=dtype)


def _adapter_keys(folder: Path) -> set[str] | None:
    """The tensor names of the adapter's weights file (None: saved another way, not checked)."""
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return set(f.keys())
