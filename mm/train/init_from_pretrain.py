"""Start a NoteVLM from an InfoNCE pretraining checkpoint (`mm pretrain`): its vision tower and fusion.

LLaVA's stage 1 starts from a contrastively trained vision encoder; here the note encoder of
:mod:`mm.train.pretrain` (``vision.*`` and ``fusion.*`` weights of ``NoteTextModel``) is copied into
``NoteVLM.vision_tower`` / ``NoteVLM.fusion``. The tower and fusion architecture are read from the
checkpoint's config, so they match by construction; the LM width must equal the pretraining
``model.d_model`` (the width of the fusion's output tokens).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from mm.config import from_dict
from mm.errors import UserError
from mm.fusion import FusionConfig
from mm.train.common import find_last_checkpoint

CHECKPOINT_DIR = "checkpoints"


def find_pretrain_checkpoint(path: str | Path) -> Path:
    """``path`` itself when it is a checkpoint folder, else the last checkpoint of the run folder ``path``."""
    p = Path(path)
    if (p / "state.json").is_file():
        return p
    last = find_last_checkpoint(p / CHECKPOINT_DIR)
    if last is None:
        raise UserError(
            f"{p} is neither a checkpoint folder nor a run folder with {CHECKPOINT_DIR}/step-*; "
            "run `mm pretrain --out DIR` first and pass DIR"
        )
    return last


def pretrain_parts(path: str | Path) -> dict[str, Any]:
    """Vision config dict, fusion kind / budget / kwargs, ``d_model`` and ``max_images`` of a checkpoint."""
    ckpt = find_pretrain_checkpoint(path)
    cfg = json.loads((ckpt / "state.json").read_text()).get("config", {})
    model = cfg.get("model")
    if not isinstance(model, dict) or not {"vision", "fusion", "d_model"} <= set(model):
        raise UserError(
            f"{ckpt} has no pretraining model config (model.vision / model.fusion / model.d_model); "
            "is it a `mm pretrain` checkpoint?"
        )
    fusion = from_dict(FusionConfig, dict(model["fusion"]), "model.fusion")
    return {
        "checkpoint": ckpt,
        "vision_config": dict(model["vision"]),
        "fusion_kind": fusion.kind,
        "fusion_budget": fusion.budget,
        "fusion_kwargs": fusion.kind_kwargs(),
        "d_model": int(model["d_model"]),
        "max_images": int(model.get("max_images", 4)),
    }


def load_pretrained_parts(model: Any, path: str | Path) -> dict[str, int]:
    """Copy ``vision.*`` / ``fusion.*`` of the checkpoint into ``model``; returns tensors loaded per part.

    Every tensor of both parts must be present with the same shape (else a :class:`UserError` naming the
    first mismatch).
    """
    ckpt = find_pretrain_checkpoint(path)
    state = load_file(str(ckpt / "model.safetensors"))
    loaded = {}
    for src, dst in (("vision", "vision_tower"), ("fusion", "fusion")):
        part = getattr(model, dst)
        own = part.state_dict()
        got = {k[len(src) + 1 :]: v for k, v in state.items() if k.startswith(src + ".")}
        missing = sorted(set(own) - set(got))
        if missing:
            raise UserError(f"{ckpt}: pretrained {src} lacks {missing[:3]}; the architectures differ")
        for k, v in own.items():
            if tuple(got[k].shape) != tuple(v.shape):
                raise UserError(
                    f"{ckpt}: {src}.{k} has shape {tuple(got[k].shape)} but the NoteVLM expects "
                    f"{tuple(v.shape)}; the LM hidden size must equal the pretraining model.d_model"
                )
        part.load_state_dict({k: got[k] for k in own}, strict=True)
        loaded[dst] = len(own)
    return loaded
