"""`VLMAdapter`: one interface over any image-text-to-text model (NoteVLM or a transformers family).

Everything family-specific lives in two hooks of a subclass: :meth:`VLMAdapter.build_prompts` (samples
-> left-padded model inputs via the processor's chat template) and :meth:`VLMAdapter.lora_config` (the
PEFT config with the family's LM targets); positions are built by :meth:`VLMAdapter.position_ids`.
Generation, answer log-probs, LoRA and the merged save are shared.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from mm.model.adapter.batching import (
    append_answers,
    first_response_column,
    gather_logps,
    padded_position_ids,
    trim_at_eos,
)
from mm.train.fsdp import synced_kwargs

NOT_MODEL_INPUTS = ("response_mask", "labels")
"""Batch entries the adapters add for scoring; never passed to the model."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One user turn about some images, with an optional assistant answer."""

    images: Sequence[Any]
    """1..N images (PIL images; NoteVLM also takes paths, uint8 arrays, float tensors)."""
    text: str
    """The user's text; the images come before it in the user turn."""
    answer: str | None = None
    """The assistant's answer (scored by `answer_logps` when no answers are passed)."""

    def __post_init__(self) -> None:
        if isinstance(self.images, (str, Path)) or not isinstance(self.images, Sequence):
            raise TypeError(f"Sample.images must be a list of images, got {type(self.images).__name__}")
        if len(self.images) < 1:
            raise ValueError("Sample.images is empty: a sample needs at least one image")
        if not isinstance(self.text, str):
            raise TypeError(f"Sample.text must be a str, got {type(self.text).__name__}")


@dataclass(kw_only=True)
class Generation:
    """What :meth:`VLMAdapter.generate_ids` returns."""

    texts: list[str]
    """Decoded new tokens per sample (special tokens skipped, stripped)."""
    token_ids: list[list[int]]
    """Raw new token ids per sample, up to and including the first eos (feed them to `answer_logps`)."""
    sequences: torch.Tensor
    """(B, P + R) prompt (left padded, P columns) + generated ids as `generate` returned them."""
    prompt_length: int
    """P: the number of prompt columns in ``sequences``."""


class VLMAdapter(ABC):
    """A VLM and its processor behind one batched interface (see ``docs/byo.md``).

    Args (keyword-only): model: the model (a `PreTrainedModel`, or a `PeftModel` of one); processor: its
    processor (a transformers `ProcessorMixin`, or `NoteProcessor` for NoteVLM).
    """

    family: str = "?"

    def __init__(self, *, model: Any, processor: Any) -> None:
        self._model = model
        self.processor = processor
        if self.pad_token_id is None:
            raise UserError(
                f"{self.family}: neither the tokenizer nor the generation config has a pad token; set "
                "processor.tokenizer.pad_token (e.g. to the eos token) before building the adapter"
            )

    # ------------------------------------------------------------------ properties
    @property
    def model(self) -> Any:
        """The wrapped model (a `PeftModel` after :meth:`apply_lora`)."""
        return self._model

    @property
    def base_model(self) -> Any:
        """The transformers model under any PEFT wrapper."""
        m = self._model
        return m.get_base_model() if hasattr(m, "get_base_model") else m

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    @property
    def device(self) -> torch.device:
        return next(self._model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self._model.parameters()).dtype

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends an answer (the generation config's, else the tokenizer's eos)."""
        eos = self.base_model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            raise UserError(f"{self.family}: no eos token in the generation config or the tokenizer")
        return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]

    @property
    def eos_token_id(self) -> int:
        """The id appended to scored text answers: the first of :attr:`eos_token_ids`."""
        return self.eos_token_ids[0]

    @property
    def pad_token_id(self) -> int | None:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.base_model.generation_config.pad_token_id

    @property
    def placeholder_ids(self) -> list[int]:
        """Ids a model is never let to generate: the placeholders it fills with image (video) features. A
        generated one is an image token with no image, and the next forward over the sequence fails
        ("image features and image tokens do not match"); a random or young model does sample them."""
        config = self.base_model.config
        ids = {getattr(config, k, None) for k in ("image_token_id", "image_token_index", "video_token_id")}
        return sorted(int(i) for i in ids if i is not None)

    # ------------------------------------------------------------------ family hooks
    @abstractmethod
    def build_prompts(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """Model inputs of the user turns + generation prompts, left padded, on the model's device.

        Returns ``input_ids`` / ``attention_mask`` (B, P) and the family's image inputs (e.g.
        ``pixel_values``; ``image_grid_thw`` for Qwen2-VL, ``pixel_attention_mask`` for Idefics3,
        ``image_sizes`` for LLaVA-NeXT, ``image_mask`` for NoteVLM). Answers are never part of it.
        """

    @abstractmethod
    def lora_config(
        self, *, r: int, alpha: int, dropout: float, target_modules: Sequence[str] | str | None
    ) -> Any:
        """The `peft.LoraConfig` for this family (LM projections only, anchored at the LM)."""

    def position_ids(self, batch: dict[str, Any]) -> torch.Tensor | None:
        """Position ids (B, T) for a scoring forward, as `generate` builds them (None: the model does)."""
        return padded_position_ids(batch["attention_mask"])

    # ------------------------------------------------------------------ inputs
    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Tensors to the model's device; floating ones (pixels) to the model's dtype."""
        device, dtype = self.device, self.dtype
        out = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                v = v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device)
            out[k] = v
        return out

    def encode_answer(self, answer: str | Sequence[int]) -> list[int]:
        """Token ids of an answer: text -> its tokens (no special tokens) + eos; ids -> used as given."""
        if isinstance(answer, str):
            return [*self.tokenizer(answer, add_special_tokens=False)["input_ids"], self.eos_token_id]
        if isinstance(answer, torch.Tensor):
            answer = answer.tolist()
        return [int(t) for t in answer]

    def answer_batch(
        self, samples: Sequence[Sample], answers: Sequence[str | Sequence[int]] | None = None
    ) -> dict[str, Any]:
        """Prompts (left padded) + answers (right padded) with ``response_mask``, on the model's device.

        ``answers[b]`` is a text (tokenised alone, eos appended) or token ids (e.g. `Generation.token_ids`,
        used as they are); default: each sample's ``answer``. Prompt and answer are tokenised separately
        and their ids concatenated, exactly what generation would have produced. Returns the model inputs
        (B, T) plus ``response_mask`` (B, T), 1 exactly on answer tokens.
        """
        samples = list(samples)
        if answers is None:
            missing = [i for i, s in enumerate(samples) if s.answer is None]
            if missing:
                raise ValueError(f"samples {missing} have no answer; pass answers= or set Sample.answer")
            answers = [s.answer for s in samples]
        if len(answers) != len(samples):
            raise ValueError(f"need one answer per sample: {len(samples)} samples, {len(answers)} answers")
        prompts = self.build_prompts(samples)
        ids = [self.encode_answer(a) for a in answers]
        return self.to_device(append_answers(prompts, ids, pad_token_id=self.pad_token_id))

    # ------------------------------------------------------------------ scoring
    def token_logps(
        self, batch: dict[str, Any], *, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs of a batch's response tokens, one forward pass (KV cache off).

        ``batch``: model inputs (B, T) with ``response_mask`` (B, T) (from :meth:`answer_batch`, or a
        rollout in the same layout). Logits are computed only from the first response column on.

        Returns ``(logps, response_mask)``, both (B, T): ``logps[b, t]`` is log p(input_ids[b, t] | ids
        before it) under softmax(logits / temperature), 0 where the mask is 0. Gradients flow when the
        caller has them enabled (wrap in ``torch.no_grad()`` to evaluate).
        """
        logps, mask, _ = self._response_pass(batch, temperature=temperature, states=False)
        return logps, mask

    def token_logps_states(
        self, batch: dict[str, Any], *, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`token_logps` plus, from the same forward, the state each response token is chosen in:
        ``states`` (B, T, H), ``states[b, t]`` the LM's last hidden layer at position t - 1 (what a value
        head reads, as TRL's and verl's critics), 0 where the mask is 0."""
        return self._response_pass(batch, temperature=temperature, states=True)

    def _response_pass(
        self, batch: dict[str, Any], *, temperature: float, states: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        ids, resp = batch["input_ids"], batch["response_mask"]  # (B, T)
        start = first_response_column(resp)
        keep = ids.shape[1] - start + 1
        inputs = {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS}
        positions = self.position_ids(batch)
        if positions is not None:
            inputs["position_ids"] = positions
        if states:
            inputs["output_hidden_states"] = True
        out = self._model(**inputs, use_cache=False, logits_to_keep=keep)
        logits = out.logits[:, -keep:-1]  # (B, W, V): column start-1+w predicts ids[:, start+w]
        window = gather_logps(logits, ids[:, start:], temperature=temperature)  # (B, W)
        logps = torch.zeros(ids.shape, dtype=window.dtype, device=window.device)  # (B, T)
        logps[:, start:] = window
        mask = resp.to(torch.long)
        hidden = None
        if states:
            last = out.hidden_states[-1]  # (B, T, H), after the final norm
            hidden = torch.zeros_like(last)  # (B, T, H)
            hidden[:, start:] = last[:, start - 1 : -1]  # position t-1 is the state token t is chosen in
            hidden = hidden * mask[..., None].to(hidden.dtype)
        return logps.masked_fill(mask == 0, 0.0), mask, hidden

    def answer_logps(
        self,
        samples: Sequence[Sample],
        answers: Sequence[str | Sequence[int]] | None = None,
        *,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs (B, T) of the answers and the response mask (B, T) (see :meth:`answer_batch`
        for the layout and :meth:`token_logps` for the values). ``mask.sum(1)`` = answer lengths in tokens
        (eos included for text answers)."""
        return self.token_logps(self.answer_batch(samples, answers), temperature=temperature)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate_ids(
        self,
        samples: Sequence[Sample],
        *,
        max_new_tokens: int = 64,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        **generate_kwargs: Any,
    ) -> Generation:
        """Continue each sample's chat-template generation prompt (left-padded batch, KV cache).

        Greedy unless ``do_sample``; ``temperature`` / ``top_p`` / ``top_k`` (None = no top-k) apply only
        when sampling and override the checkpoint's generation config. Other settings of that config
        (e.g. ``repetition_penalty``) still apply unless passed here: pass them neutral when the sampled
        ids are scored with :meth:`answer_logps`, which sees plain softmax(logits / temperature).
        Extra keyword arguments go to the model's `generate`. The model is in eval mode meanwhile. The
        image placeholders (:attr:`placeholder_ids`) are never generated unless ``suppress_tokens`` says
        otherwise.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if do_sample and (temperature <= 0 or not 0 < top_p <= 1):
            raise ValueError(f"sampling needs temperature > 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
        inputs = self.to_device(self.build_prompts(samples))
        sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k or 0} if do_sample else {}
        generate_kwargs.setdefault("suppress_tokens", self.placeholder_ids or None)
        # FSDP: every rank keeps stepping until all ranks' rows end
        generate_kwargs = {**synced_kwargs(self._model), **generate_kwargs}
        was_training = self._model.training
        self._model.eval()
        try:
            sequences = self._model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=do_sample,
                pad_token_id=self.pad_token_id,
                eos_token_id=self.eos_token_ids,
                **sampling,
                **generate_kwargs,
            )  # (B, P + R)
        finally:
            self._model.train(was_training)
        P = inputs["input_ids"].shape[1]
        token_ids = trim_at_eos(sequences[:, P:], self.eos_token_ids)
        texts = [t.strip() for t in self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)]
        return Generation(texts=texts, token_ids=token_ids, sequences=sequences, prompt_length=P)

    def generate(self, samples: Sequence[Sample], **kwargs: Any) -> list[str]:
        """The decoded answers of :meth:`generate_ids` (same arguments)."""
        return self.generate_ids(samples, **kwargs).texts

    # ------------------------------------------------------------------ LoRA and saving
    def apply_lora(
        self,
        r: int = 8,
        alpha: int = 16,
        dropout: float = 0.0,
        target_modules: Sequence[str] | str | None = None,
    ) -> Any:
        """Wrap the model in PEFT LoRA on the LM's projections (vision tower frozen); returns the PeftModel.

        ``target_modules``: None = the family's defaults (attention + MLP projections of the LM); a list of
        leaf names (e.g. ``["q_proj", "v_proj"]``) = those, inside the LM only; a str = a PEFT regex as is.
        """
        from peft import get_peft_model

        if r < 1 or not 0.0 <= dropout < 1.0:
            raise ValueError(f"LoRA needs r >= 1 and 0 <= dropout < 1, got r={r}, dropout={dropout}")
        if hasattr(self._model, "peft_config"):
            raise UserError(f"{self.family}: LoRA is already applied; merge_and_save() first or reload")
        cfg = self.lora_config(r=r, alpha=alpha, dropout=dropout, target_modules=target_modules)
        self._model = get_peft_model(self._model, cfg)
        return self._model

    def merge_and_save(self, out_dir: str | Path) -> Path:
        """Write a complete model folder (LoRA merged) + processor to ``out_dir`` and the LoRA to
        ``out_dir/adapter``. The adapter then holds the merged model (LoRA gone, as PEFT's
        `merge_and_unload`); call :meth:`apply_lora` again to keep training with fresh adapters.
        Without LoRA the model is saved as it is (no ``adapter/``). Returns ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if hasattr(self._model, "peft_config"):
            self._model.save_pretrained(str(out / "adapter"))
            self._model = self._model.merge_and_unload()
        self._model.save_pretrained(str(out))
        self.processor.save_pretrained(str(out))
        return out
