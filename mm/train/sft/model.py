"""The NoteVLM of ``mm train``: tokenizer, model + processor (random, from a pretraining run or a saved
model), what trains in each stage (freezing / LoRA), and the final save."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from mm.config import from_dict, to_dict
from mm.data.tokenizer import load_tokenizer as project_tokenizer
from mm.errors import UserError
from mm.model import NoteProcessor, NoteVLMConfig, NoteVLMForConditionalGeneration, pretrained_lm
from mm.model.peft_presets import (
    LoraPreset,
    apply_lora,
    enable_checkpointing,
    freeze_for_stage,
    trainable_counts,
)
from mm.train import init_from_pretrain
from mm.train.common import unwrap
from mm.train.sft.config import TrainConfig
from mm.vision import VisionConfig, normalisation


def load_tokenizer(path: str | None) -> Any:
    """The tokenizer at ``path`` (a save_pretrained folder) or the project tokenizer."""
    if path is not None:
        if not Path(path).is_dir():
            raise UserError(
                f"model.tokenizer={path!r} is not a folder; give a save_pretrained tokenizer folder"
            )
        return PreTrainedTokenizerFast.from_pretrained(path)
    return project_tokenizer()


def build_model_and_processor(cfg: TrainConfig) -> tuple[Any, Any, dict[str, Any]]:
    """The NoteVLM, its NoteProcessor and a note of where the weights came from (seed set by the caller).

    ``model.text.pretrained`` takes the LM (config, weights, tokenizer, chat template) from a folder;
    ``model.vision.pretrained`` the tower's weights, and its architecture, input size and normalisation
    (`mm.vision.resolve_pretrained`), which the processor then applies.
    """
    if cfg.init.model:
        d = Path(cfg.init.model)
        if not (d / "config.json").is_file():
            raise UserError(
                f"init.model={d} has no config.json; pass a folder written by `mm train` (OUT/model)"
            )
        model = NoteVLMForConditionalGeneration.from_pretrained(str(d))
        return model, NoteProcessor.from_pretrained(d), {"init": "model", "from": str(d)}
    lm_folder = cfg.model.text.get("pretrained")
    if lm_folder is not None:
        tok = pretrained_lm.load_lm_tokenizer(lm_folder)
        text = pretrained_lm.lm_text_config(lm_folder, tok)
        pretrained_lm.check_agreement(cfg.model.text, text, lm_folder)
    else:
        tok = load_tokenizer(cfg.model.tokenizer)
        text = {**cfg.model.text, "vocab_size": len(tok)}
    vision, fusion = to_dict(cfg.model.vision), cfg.model.fusion
    parts = {
        "vision_config": vision,
        "fusion_kind": fusion.kind,
        "fusion_budget": fusion.budget,
        "fusion_kwargs": fusion.kind_kwargs(),
    }
    origin: dict[str, Any] = {"init": "random"}
    if cfg.init.pretrain:
        pre = init_from_pretrain.pretrain_parts(cfg.init.pretrain)
        parts = {k: pre[k] for k in parts}
        hidden = int(text.get("hidden_size", 0))
        if hidden != pre["d_model"]:
            fix = (
                "pick an LM of that width"
                if lm_folder is not None
                else f"set model.text.hidden_size={pre['d_model']}"
            )
            raise UserError(
                f"model.text.hidden_size={hidden} but the pretrained fusion outputs {pre['d_model']}; {fix}"
            )
    config = NoteVLMConfig(
        **parts,
        text_config=text,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        max_images=cfg.model.max_images,
        image_index_embeddings=cfg.model.image_index_embeddings,
        token_position_embeddings=cfg.model.token_position_embeddings,
        visibility=cfg.model.visibility,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = NoteVLMForConditionalGeneration(config)
    if cfg.init.pretrain:
        loaded = init_from_pretrain.load_pretrained_parts(model, cfg.init.pretrain)
        origin = {"init": "pretrain", "from": str(pre["checkpoint"]), "tensors": loaded}
    if lm_folder is not None:
        origin["text"] = {"from": str(lm_folder), **pretrained_lm.copy_lm_weights(model, lm_folder)}
    if cfg.model.vision.pretrained is not None and not cfg.init.pretrain:
        origin["vision"] = {"from": str(cfg.model.vision.pretrained)}
    vision_cfg = from_dict(VisionConfig, dict(config.vision_config), "vision_config")
    mean, std = normalisation(vision_cfg)
    h, w = model.vision_tower.image_size
    if h != w:
        raise UserError(f"NoteProcessor makes square images; the vision tower takes {h}x{w}")
    processor = NoteProcessor(
        tokenizer=tok,
        image_size=int(h),
        tokens_per_image=config.fusion_budget,
        max_length=cfg.model.max_length,
        max_images=cfg.model.max_images,
        image_mean=mean,
        image_std=std,
        resize=vision_cfg.resize,
        budget_per=config.fusion_kwargs.get("budget_per", "image"),
    )
    return model, processor, origin


def prepare_trainable(model: Any, cfg: TrainConfig) -> tuple[Any, dict[str, int]]:
    """Freeze for the stage (or wrap with LoRA); returns the model to train and trainable counts."""
    if cfg.lora.enabled:
        preset = LoraPreset(r=cfg.lora.r, alpha=cfg.lora.alpha, dropout=cfg.lora.dropout)
        model = apply_lora(model, preset, gradient_checkpointing=cfg.train.gradient_checkpointing)
        return model, trainable_counts(model)
    counts = freeze_for_stage(model, cfg.train.stage)
    if cfg.train.train_vision:
        for p in model.vision_tower.parameters():
            p.requires_grad_(True)
        counts = trainable_counts(model)
    if cfg.train.gradient_checkpointing:
        enable_checkpointing(model)
    return model, counts


def save_final(model: Any, processor: Any, out: Path, *, lora: bool) -> Path:
    """Write ``out/model`` (save_pretrained + processor); LoRA runs also write ``out/adapter``, then merge."""
    target = out / "model"
    tmp = out / ".model.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    model = unwrap(model)
    if lora:
        model.save_pretrained(str(out / "adapter"))
        model = model.merge_and_unload()
    model.save_pretrained(str(tmp))
    processor.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(target)
    tmp.replace(target)
    return target
