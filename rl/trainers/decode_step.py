"""A lean one-token decode step for Qwen2 / Llama language models (plain or inside NoteVLM, PEFT or not).

The rollout's decode loop (:func:`rl.trainers.rollout.sample_tokens`) runs one forward per generated
token with a tiny batch, where a CPU step is mostly per-call overhead: transformers' model forward
wraps the layers in output capturing, kwarg checks, mask building and rotary bookkeeping. This step
calls the same submodules in the same order with the same functions (``apply_rotary_pos_emb`` of the
model's own module, transformers' ``sdpa_attention_forward``, ``cache.update``), so its logits are
those of ``model(input_ids=..., cache=...)``: bit-identical here (tested), ~22% less time per step on
the benchmark's 2-layer Qwen2. Only the one-token step goes through it; the prefill stays the model's.

It applies to decoders whose classes are exactly ``Qwen2Model`` / ``LlamaModel`` with SDPA attention and
no sliding-window layers; :func:`lean_decode_step` returns None for anything else (the caller then runs
the model's forward). Submodules are called as modules, so LoRA layers and ``modules_to_save`` copies
take effect as in the full forward. The attention mask is the caller's: None without padding, else the
``(N, 1, 1, T)`` bool key mask an SDPA model builds for one query (see ``sample_tokens``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

SUPPORTED = {"Qwen2Model": "qwen2", "LlamaModel": "llama"}
"""Decoder class name -> transformers model module whose ``apply_rotary_pos_emb`` the step uses."""


def _parts(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` of a causal LM or NoteVLM (a PEFT wrapper is looked through), or None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", None)
    decoder = getattr(inner, "language_model", inner)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if decoder is None or head is None:
        return None
    return decoder, head


def lean_decode_step(model: Any) -> Callable[..., torch.Tensor] | None:
    """``step(ids (N, 1), position_ids (N, 1), cache, mask) -> logits (N, 1, V)`` for ``model``, or None
    when the model is not of a supported kind (see the module docstring)."""
    found = _parts(model)
    if found is None:
        return None
    decoder, head = found
    kind = SUPPORTED.get(type(decoder).__name__)
    config = getattr(decoder, "config", None)
    if kind is None or config is None or config._attn_implementation != "sdpa":
        return None
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return None
    if getattr(config, "use_sliding_window", False):
        return None
    rotary = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}").apply_rotary_pos_emb
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layers = list(decoder.layers)
    embed, rotary_emb, norm = decoder.embed_tokens, decoder.rotary_emb, decoder.norm

    def step(ids: torch.Tensor, position_ids: torch.Tensor, cache: Any, mask: torch.Tensor | None):
        x = embed(ids)  # (N, 1, D)
        cos, sin = rotary_emb(x, position_ids)  # (N, 1, head_dim) each
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)  # (N, 1, D)
            shape = (*h.shape[:-1], -1, attn.head_dim)
            q = attn.q_proj(h).view(shape).transpose(1, 2)  # (N, H, 1, hd)
            k = attn.k_proj(h).view(shape).transpose(1, 2)  # (N, Hkv, 1, hd)
            v = attn.v_proj(h).view(shape).transpose(1, 2)  # (N, Hkv, 1, hd)
            q, k = rotary(q, k, cos, sin)
            k, v = cache.update(k, v, i)  # (N, Hkv, T, hd)
            out, _ = sdpa_attention_forward(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
            x = x + attn.o_proj(out.reshape(*h.shape[:-1], -1).contiguous())  # (N, 1, D)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return head(norm(x))  # (N, 1, V)

    return step
