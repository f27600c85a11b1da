"""A pretrained causal LM as NoteVLM's language model (``model.text.pretrained: DIR``).

DIR is any local ``AutoModelForCausalLM`` folder whose LM is a decoder plus a linear head (Qwen2, Llama,
Mistral, ...). From it NoteVLM takes: the architecture (``config.json``; the fusion's output width follows
its hidden size), the tokenizer and its chat template, and the weights of the decoder and the head. The
NoteVLM tokens ``<image> <im_start> <im_end>`` (and ``<pad>`` when the tokenizer has no pad token) are added
as special tokens; when that grows the vocabulary, the embedding and the head get new rows set to the mean
of the pretrained rows (the other rows are the folder's, bit for bit).

    tok = load_lm_tokenizer(DIR)
    config = NoteVLMConfig(text_config=lm_text_config(DIR, tok), ...)
    model = NoteVLMForConditionalGeneration(config)
    copy_lm_weights(model, DIR)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken

from mm.errors import UserError
from mm.model.configuration import TINY_TEXT_CONFIG
from mm.model.processing import IM_END_TOKEN, IM_START_TOKEN, IMAGE_TOKEN

NOTE_TOKENS = (IMAGE_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
# Keys of a transformers config dict that are bookkeeping, not architecture.
_META_KEYS = ("transformers_version", "architectures", "_name_or_path", "auto_map", "dtype", "torch_dtype")


_FOLDER_HINT = (
    "give a local AutoModelForCausalLM folder "
    "(save_pretrained, or `huggingface-cli download ID --local-dir DIR`)"
)


def _folder(path: str | Path, where: str) -> Path:
    d = Path(path)
    if not (d / "config.json").is_file():
        raise UserError(f"{where}={d} has no config.json; {_FOLDER_HINT}")
    return d


def check_text_section(text: dict[str, Any], where: str = "model.text") -> None:
    """Raise ValueError for keys of ``text`` that are neither ``pretrained`` nor fields of the LM's
    transformers config (the folder's ``model_type`` with ``pretrained``, else ``text["model_type"]``)."""
    from transformers import CONFIG_MAPPING  # function-level: only config validation needs the mapping

    pretrained = text.get("pretrained")
    if pretrained is not None:
        if not isinstance(pretrained, str):
            raise ValueError(f"{where}.pretrained must be a folder path, got {pretrained!r}")
        config_file = Path(pretrained) / "config.json"
        if not config_file.is_file():
            raise ValueError(f"{where}.pretrained={pretrained} has no config.json; {_FOLDER_HINT}")
        model_type = json.loads(config_file.read_text()).get("model_type")
    else:
        model_type = text.get("model_type")
    if model_type is None:
        raise ValueError(
            f"{where} has neither pretrained nor model_type (keys given: {sorted(text)}; a misspelt key?): "
            f"set {where}.pretrained: DIR, or {where}.model_type (qwen2, llama, ...) and that config's fields"
        )
    if model_type not in CONFIG_MAPPING:
        raise ValueError(
            f"{where}: model_type {model_type!r} is not a transformers model type (e.g. qwen2, llama)"
        )
    defaults = CONFIG_MAPPING[model_type]()
    unknown = sorted(k for k in text if k not in ("pretrained", "model_type") and not hasattr(defaults, k))
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {unknown}: not fields of the {model_type} config "
            f"({type(defaults).__name__}); valid: pretrained, model_type and that config's fields"
        )


def load_lm_tokenizer(folder: str | Path) -> Any:
    """The folder's tokenizer (chat template included) with NoteVLM's special tokens added."""
    from transformers import AutoTokenizer  # function-level: loads the family's tokenizer code on use

    d = _folder(folder, "model.text.pretrained")
    tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    if tok.eos_token_id is None:
        raise UserError(f"the tokenizer in {d} has no eos token; NoteVLM ends every answer with it")
    vocab = tok.get_vocab()
    missing = [t for t in NOTE_TOKENS if t not in vocab]
    if missing:
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True)
    if tok.pad_token_id is None:
        tok.add_special_tokens({"pad_token": "<pad>"})
    return tok


def text_hidden_size(text: dict[str, Any]) -> int | None:
    """The LM width a ``model.text`` section gives: the pretrained folder's ``hidden_size`` (read from its
    config.json) when ``pretrained`` is set, else the section's own ``hidden_size`` (None if absent)."""
    pretrained = text.get("pretrained")
    if pretrained is None:
        return text.get("hidden_size")
    config = json.loads((_folder(pretrained, "model.text.pretrained") / "config.json").read_text())
    hidden = config.get("hidden_size", config.get("text_config", {}).get("hidden_size"))
    return None if hidden is None else int(hidden)


def lm_text_config(folder: str | Path, tokenizer: Any) -> dict[str, Any]:
    """The folder's LM config as a dict, its vocabulary grown to hold every tokenizer id."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(_folder(folder, "model.text.pretrained")), local_files_only=True)
    out = {k: v for k, v in config.to_dict().items() if k not in _META_KEYS}
    out["vocab_size"] = max(int(config.vocab_size), len(tokenizer))
    return out


def check_agreement(text: dict[str, Any], lm_config: dict[str, Any], folder: str) -> None:
    """UserError when a ``model.text`` key set next to ``pretrained`` disagrees with the folder's config.

    The untouched default section (``TINY_TEXT_CONFIG``) counts as unset; ``vocab_size`` comes from the
    tokenizer and is not compared.
    """
    rest = {k: v for k, v in text.items() if k != "pretrained"}
    if rest == TINY_TEXT_CONFIG:
        return
    bad = {k: (v, lm_config.get(k)) for k, v in rest.items() if k != "vocab_size" and lm_config.get(k) != v}
    if bad:
        detail = ", ".join(f"{k}={mine!r} (folder: {theirs!r})" for k, (mine, theirs) in sorted(bad.items()))
        raise UserError(
            f"model.text.pretrained={folder} fixes the LM's architecture, but model.text also sets {detail}; "
            "drop those keys (on the command line: --set 'model.text={pretrained: DIR}')"
        )


@torch.no_grad()
def copy_lm_weights(model: Any, folder: str | Path) -> dict[str, int]:
    """Copy the folder's decoder and head into ``model`` (a NoteVLM built from :func:`lm_text_config`).

    Rows of the embedding / head beyond the folder's vocabulary are set to the mean of its rows. Returns
    {"tensors": copied tensors, "new_rows": rows added}.
    """
    from transformers import AutoModelForCausalLM

    d = _folder(folder, "model.text.pretrained")
    lm = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32, local_files_only=True)
    source = lm.get_decoder().state_dict()
    target = model.language_model
    embed = target.get_input_embeddings().weight
    embed_key = next(n for n, p in target.named_parameters() if p is embed)
    old_rows = source[embed_key].shape[0]
    source[embed_key] = _grow_rows(source[embed_key], embed.shape[0])
    try:
        target.load_state_dict(source, strict=True)
    except RuntimeError as e:
        raise UserError(
            f"the decoder weights in {d} do not fit the LM built from its config ({str(e).splitlines()[0]})"
        ) from e
    head = lm.get_output_embeddings().weight
    model.lm_head.weight.copy_(_grow_rows(head, model.lm_head.weight.shape[0]))
    return {"tensors": len(source) + 1, "new_rows": model.lm_head.weight.shape[0] - old_rows}


def _grow_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """(V, D) -> (rows, D): the same rows, then copies of their mean."""
    if rows < weight.shape[0]:
        raise UserError(f"the LM has {weight.shape[0]} vocabulary rows but the model only {rows}")
    extra = weight.mean(0, keepdim=True).expand(rows - weight.shape[0], -1)  # (rows - V, D)
    return torch.cat([weight, extra], 0)
