"""How the agent loop talks to a model: token segments with images, batched generation, scoring batches.

A trajectory is a list of token ids with images spliced in where their placeholders are. The loop never
decodes and re-encodes policy tokens: the prompt and each observation are tokenised once, on their own,
and appended as ids; generated ids are kept as generated. Each family says how an image becomes
placeholder tokens plus model inputs (:meth:`AgentBackend.image_segment`) and how a batch of rows with
their images becomes model inputs (:meth:`AgentBackend.collate_images`).

Families that take an image in the middle of a sequence (a zoom after the first turn):

- ``notevlm``: ``<im_start> <image> x K <im_end>`` anywhere; ``pixel_values`` (B, N, 3, S, S) with an
  ``image_mask`` (B, N); at most ``config.max_images`` images per trajectory, prompt images included;
  visibility "all" only (under "own" a later zoom would change what earlier text attends to).
- ``llava`` and ``gemma3`` (fixed tokens per image, ``pixel_values`` (n_images, 3, H, W) over the batch;
  Gemma 3's ``token_type_ids``, which let an image's tokens attend both ways, spliced with the ids) and
  ``qwen2_vl`` / ``qwen2_5_vl`` / ``qwen3_vl`` (``pixel_values`` rows per image from ``image_grid_thw``;
  M-RoPE positions computed by the model from the ids and grids, so a mid-sequence image is placed right).
- ``idefics3`` / ``smolvlm`` (tiles: each image is a few sub-image tiles plus a global view, ``pixel_values``
  (B, N_tiles, 3, H, W) padded per row with all-zero tiles, which the model drops, and
  ``pixel_attention_mask`` (B, N_tiles, H, W)).
- ``llava_next`` (any resolution: each image is resized to its best grid and cut into patches plus a base
  view, so its token count follows its size; ``pixel_values`` (n_images, P, 3, H, W) over the batch,
  padded to the most patches, with ``image_sizes`` (n_images, 2), from which the model unpads).
- ``internvl`` (each image up to ``max_patches`` tiles and a thumbnail by its aspect ratio, ``pixel_values``
  (total patches, 3, H, W) over the batch; a segment counts its image's patches from its ids).
- Other families: :func:`backend_for` names the supported ones.

Observations are plain text around the image, ``<obs>`` ... ``</obs>``, continuing the assistant turn
(no chat-template role switch), so every family reads them the same way; a simulated user's next message
in a dialogue is ``<user>`` ... ``</user>`` the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from mm.errors import UserError
from mm.model.adapter import Sample, VLMAdapter
from mm.model.adapter.batching import gather_logps
from rl.agent.counts import CountProcessor, number_tokens
from rl.agent.parse import TOOL_CLOSE
from rl.agent.quote import QuoteProcessor, token_pieces

OBS_OPEN = "\n<obs>"
OBS_CLOSE = "</obs>\n"
USER_OPEN = "\n<user>"
USER_CLOSE = "</user>\n"
STOPS = ("tool", "eos", "length")
"""Why a policy turn ended: a closed tool call, an eos token, or its token budget."""


@dataclass
class Segment:
    """Token ids and the model inputs of the images whose placeholders they hold, in order."""

    ids: list[int]
    images: list[Any] = field(default_factory=list)
    """Per-image model inputs (family-specific: a (3, S, S) tensor for NoteVLM, a dict of tensors else)."""
    extra: dict[str, list[int]] = field(default_factory=dict)
    """Other per-token inputs the processor returns (e.g. Qwen2-VL's ``mm_token_type_ids``)."""


@dataclass
class Turn:
    """One policy turn as generated: its raw ids, their log-probs at sampling time, why it ended."""

    ids: list[int]
    logps: list[float]
    stop: str
    text: str


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How a turn is generated."""

    do_sample: bool = False
    """Sample (else greedy)."""
    temperature: float = 1.0
    """Softmax temperature when sampling; the recorded log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass when sampling."""

    def __post_init__(self) -> None:
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"Sampling needs temperature > 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}"
            )


def cut_turn(ids: Sequence[int], eos_ids: Sequence[int], decode: Any) -> tuple[list[int], str]:
    """A turn's generated ids -> the ids up to its end and why it ended (:data:`STOPS`).

    The turn ends after the first eos, or after the token that completes the first ``</tool>``,
    whichever comes first; otherwise it ran out of tokens ("length").
    """
    ids = [int(t) for t in ids]
    eos = {int(e) for e in eos_ids}
    end = next((i + 1 for i, t in enumerate(ids) if t in eos), None)
    head = ids if end is None else ids[:end]
    if TOOL_CLOSE in decode(head):
        lo, hi = 1, len(head)  # the shortest prefix whose text holds the tag (a prefix keeps it once in)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if TOOL_CLOSE in decode(head[:mid]) else (mid + 1, hi)
        return head[:lo], "tool"
    return head, "length" if end is None else "eos"


class ToolStop:
    """A transformers stopping criterion: a row is done once its new tokens contain ``</tool>``."""

    def __init__(self, decode: Any, prompt_length: int, window: int = 16) -> None:
        self.decode, self.prompt_length, self.window = decode, prompt_length, window

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        new = input_ids[:, self.prompt_length :]  # (B, t)
        tails = new[:, -self.window :].tolist()
        done = [TOOL_CLOSE in self.decode(row) for row in tails]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # (B,)


class AgentBackend(ABC):
    """The loop's view of a model adapter (see the module docstring)."""

    max_images: int | None = None
    """Most images one trajectory can hold (None: no limit)."""

    def __init__(self, adapter: VLMAdapter) -> None:
        self.adapter = adapter

    @property
    def tokenizer(self) -> Any:
        return self.adapter.tokenizer

    @property
    def eos_token_ids(self) -> list[int]:
        return self.adapter.eos_token_ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @property
    def placeholder_ids(self) -> list[int]:
        """Ids the policy is never let to generate (``VLMAdapter.placeholder_ids``: image placeholders)."""
        return self.adapter.placeholder_ids

    def text_ids(self, text: str) -> list[int]:
        """Token ids of a text on its own (no special tokens)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ family hooks
    @abstractmethod
    def prompt(self, images: Sequence[np.ndarray], text: str) -> Segment:
        """The user turn (the note's images, then ``text``) and the generation prompt."""

    @abstractmethod
    def image_segment(self, image: np.ndarray) -> Segment:
        """The placeholder tokens and model inputs of one new image, encoded at the tower's input size."""

    @abstractmethod
    def collate_images(self, rows: Sequence[Sequence[Any]]) -> dict[str, torch.Tensor]:
        """The image inputs of a batch whose row ``b`` holds the images ``rows[b]``, in order."""

    def generate_kwargs(self, prompt_length: int) -> dict[str, Any]:
        """Extra keyword arguments of the model's `generate` for a batch of ``prompt_length`` columns
        (none by default; e.g. a logits processor that forces scripted turns in tests)."""
        return {}

    # ------------------------------------------------------------------ shared
    def observation(
        self, text: str, images: Sequence[np.ndarray] = (), labels: Sequence[str] = ()
    ) -> Segment:
        """``<obs>text[label image]...</obs>`` as non-policy tokens (``images``: ``(h, w, 3)`` each, in
        order; ``labels``: a text before each image, or none)."""
        parts = [Segment(self.text_ids(OBS_OPEN + text))]
        for k, image in enumerate(images):
            if labels:
                parts.append(Segment(self.text_ids(labels[k])))
            parts.append(self.image_segment(image))
        return join([*parts, Segment(self.text_ids(OBS_CLOSE))])

    def user_message(self, text: str) -> Segment:
        """``<user>text</user>``: the user's next message in a dialogue, as non-policy tokens."""
        return Segment(self.text_ids(USER_OPEN + text + USER_CLOSE))

    def model_inputs(self, rows: Sequence[Segment], masks: Sequence[Sequence[int]] | None = None) -> dict:
        """Left-padded model inputs (B, T) of whole rows + their images; ``response_mask`` from ``masks``."""
        T = max(len(r.ids) for r in rows)
        B = len(rows)
        pad = self.adapter.pad_token_id
        ids = torch.full((B, T), pad, dtype=torch.long)
        attention = torch.zeros(B, T, dtype=torch.long)
        keys = sorted({k for r in rows for k in r.extra})
        extra = {k: torch.zeros(B, T, dtype=torch.long) for k in keys}
        response = torch.zeros(B, T, dtype=torch.long)
        for b, row in enumerate(rows):
            n = len(row.ids)
            ids[b, T - n :] = torch.tensor(row.ids)
            attention[b, T - n :] = 1
            for k in keys:
                extra[k][b, T - n :] = torch.tensor(row.extra[k])
            if masks is not None:
                response[b, T - n :] = torch.tensor(list(masks[b]))
        batch = {"input_ids": ids, "attention_mask": attention, **extra}
        if any(r.images for r in rows):
            batch.update(self.collate_images([r.images for r in rows]))
        if masks is not None:
            batch["response_mask"] = response
        return self.adapter.to_device(batch)

    def token_pieces(self) -> list[str]:
        """Each token's text after a word (``rl.agent.quote``), computed once."""
        if getattr(self, "_pieces", None) is None:
            self._pieces = token_pieces(self.tokenizer)
        return self._pieces

    def number_tokens(self) -> list[int]:
        """Ids of the tokens that can end a number word (``rl.agent.counts``), computed once."""
        if getattr(self, "_numbers", None) is None:
            self._numbers = number_tokens(self.token_pieces())
        return self._numbers

    @torch.no_grad()
    def generate(
        self,
        rows: Sequence[Segment],
        *,
        max_new_tokens: int,
        sampling: Sampling,
        quote: Mapping[str, Sequence[str]] | None = None,
        user_texts: Sequence[str] | None = None,
        tool_texts: Sequence[str] | None = None,
    ) -> list[Turn]:
        """One policy turn for every row (batched, left padded): ids, sampling-time log-probs, stop.

        ``quote`` (tool -> argument names) with ``user_texts`` (one per row): those arguments' values are
        words of the row's user text (:mod:`rl.agent.quote`); ``tool_texts`` (one per row, the row's tool
        observations): the number words of an answer copy their counts (:mod:`rl.agent.counts`). The
        log-probs stay the model's own."""
        from transformers import LogitsProcessorList, StoppingCriteriaList

        inputs = self.model_inputs(rows)
        P = inputs["input_ids"].shape[1]
        kwargs = self.generate_kwargs(P)
        if quote:
            if user_texts is None or len(user_texts) != len(rows):
                raise ValueError("generate(quote=...) needs one user text per row")
            quoting = QuoteProcessor(self.decode, self.token_pieces(), P, user_texts, quote)
            kwargs["logits_processor"] = LogitsProcessorList([*kwargs.get("logits_processor", []), quoting])
        if tool_texts is not None:
            if len(tool_texts) != len(rows):
                raise ValueError("generate(tool_texts=...) needs one tool text per row")
            counting = CountProcessor(self.decode, self.token_pieces(), P, tool_texts, self.number_tokens())
            kwargs["logits_processor"] = LogitsProcessorList([*kwargs.get("logits_processor", []), counting])
        model = self.adapter.model
        extra = {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
        was_training = model.training
        model.eval()
        try:
            out = model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=sampling.do_sample,
                pad_token_id=self.adapter.pad_token_id,
                eos_token_id=self.eos_token_ids,
                stopping_criteria=StoppingCriteriaList([ToolStop(self.decode, P)]),
                suppress_tokens=self.placeholder_ids or None,
                output_logits=True,
                return_dict_in_generate=True,
                **(extra if sampling.do_sample else {}),
                **kwargs,
            )
        finally:
            model.train(was_training)
        new = out.sequences[:, P:]  # (B, R)
        logits = torch.stack(out.logits, dim=1)  # (B, R, V) raw logits
        temperature = sampling.temperature if sampling.do_sample else 1.0
        logps = gather_logps(logits, new, temperature=temperature).tolist()  # (B, R)
        turns = []
        for b in range(len(rows)):
            ids, stop = cut_turn(new[b].tolist(), self.eos_token_ids, self.decode)
            turns.append(Turn(ids, logps[b][: len(ids)], stop, self.decode(ids)))
        return turns


def join(segments: Sequence[Segment]) -> Segment:
    """Concatenate segments (ids, images and per-token extras; a missing extra is 0 over its tokens)."""
    keys = sorted({k for s in segments for k in s.extra})
    out = Segment([], [], {k: [] for k in keys})
    for s in segments:
        out.ids += s.ids
        out.images += s.images
        for k in keys:
            out.extra[k] += s.extra.get(k, [0] * len(s.ids))
    return out


class NoteVLMBackend(AgentBackend):
    """NoteVLM: K ``<image>`` placeholders between ``<im_start>`` / ``<im_end>`` per image."""

    def __init__(self, adapter: VLMAdapter) -> None:
        super().__init__(adapter)
        config = adapter.base_model.config
        if config.visibility != "all":
            raise UserError(
                f"the agent loop needs a NoteVLM with visibility 'all', this one has {config.visibility!r}: "
                "under 'own' a zoom image appended later would change what the earlier text attends to, so "
                "sampling-time log-probs would not match the trajectory's; use a model trained with 'all'"
            )
        self.max_images = int(config.max_images)

    def prompt(self, images: Sequence[np.ndarray], text: str) -> Segment:
        proc = self.adapter.processor
        return Segment(proc.prompt_ids(len(images), text), [proc.load_image(im) for im in images])

    def image_segment(self, image: np.ndarray) -> Segment:
        proc = self.adapter.processor
        ids = [proc.im_start_id, *[proc.image_token_id] * proc.tokens_per_image, proc.im_end_id]
        return Segment(ids, [proc.load_image(image)])

    def collate_images(self, rows: Sequence[Sequence[Any]]) -> dict[str, torch.Tensor]:
        S = self.adapter.processor.image_size
        N = max(len(r) for r in rows)
        pixels = torch.zeros(len(rows), N, 3, S, S)  # (B, N, 3, S, S)
        mask = torch.zeros(len(rows), N, dtype=torch.bool)  # (B, N)
        for b, images in enumerate(rows):
            for i, im in enumerate(images):
                pixels[b, i], mask[b, i] = im, True
        return {"pixel_values": pixels, "image_mask": mask}


IMAGE_MARKERS = {
    "llava": "<image>",
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "gemma3": "<start_of_image>",
}
"""Families whose image inputs are flat over the batch, and the marker the processor expands."""


class FlatImageBackend(AgentBackend):
    """Transformers families with per-image rows of ``pixel_values`` (+ ``image_grid_thw``), batch-flat."""

    markers = IMAGE_MARKERS
    """The families this backend takes, and the marker their processor expands into an image's tokens."""

    def __init__(self, adapter: VLMAdapter) -> None:
        super().__init__(adapter)
        self.marker = self.markers[adapter.family]

    def _split(self, out: dict[str, Any], n: int) -> list[dict[str, torch.Tensor]]:
        """Processor image outputs for ``n`` images -> one dict per image."""
        pixels = out["pixel_values"]
        if "image_grid_thw" in out:
            grid = out["image_grid_thw"]  # (n, 3)
            sizes = [int(g.prod()) for g in grid]
            return [
                {"pixel_values": p, "image_grid_thw": grid[i : i + 1]}
                for i, p in enumerate(torch.split(pixels, sizes))
            ]
        if pixels.shape[0] != n:
            raise UserError(
                f"{self.adapter.family}: expected {n} rows of pixel_values, got {pixels.shape[0]}"
            )
        return [{"pixel_values": pixels[i : i + 1]} for i in range(n)]

    def _segment(self, out: dict[str, Any], n: int) -> Segment:
        ids = out["input_ids"][0].tolist()
        extra = {k: out[k][0].tolist() for k in ("mm_token_type_ids", "token_type_ids") if k in out}
        return Segment(ids, self._split(out, n), extra)

    def prompt(self, images: Sequence[np.ndarray], text: str) -> Segment:
        out = self.adapter.build_prompts([Sample(images=[_pil(im) for im in images], text=text)])
        return self._segment({k: v.cpu() for k, v in out.items()}, len(images))

    def image_segment(self, image: np.ndarray) -> Segment:
        out = self.adapter.processor(
            text=[self.marker], images=[[_pil(image)]], return_tensors="pt", add_special_tokens=False
        )
        return self._segment(dict(out), 1)

    def collate_images(self, rows: Sequence[Sequence[Any]]) -> dict[str, torch.Tensor]:
        flat = [im for images in rows for im in images]
        return {k: torch.cat([im[k] for im in flat]) for k in flat[0]}


PATCHED_IMAGE_MARKERS = {"llava_next": "<image>"}
"""Families whose images are any-resolution patch stacks with ``image_sizes``, and the processor's marker."""


class PatchedImageBackend(FlatImageBackend):
    """LLaVA-NeXT: an image is a stack of patches (its best grid's crops and a base view) with its size.

    A segment keeps one entry per image: ``pixel_values`` (1, p, 3, H, W), its own ``p`` patches without the
    processor's batch padding, and ``image_sizes`` (1, 2). A batch pads every image to the most patches
    with zeros and concatenates them over the batch, as the processor does for several images; the
    model counts each image's patches from its size and drops the rest.
    """

    markers = PATCHED_IMAGE_MARKERS

    def _split(self, out: dict[str, Any], n: int) -> list[dict[str, torch.Tensor]]:
        from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

        pixels, sizes = out["pixel_values"], out["image_sizes"]  # (n, P, 3, H, W) padded, (n, 2)
        if pixels.shape[0] != n:
            raise UserError(
                f"{self.adapter.family}: expected {n} images of pixel_values, got {pixels.shape[0]}"
            )
        config = self.adapter.base_model.config
        counts = [
            image_size_to_num_patches(
                size.tolist(), config.image_grid_pinpoints, config.vision_config.image_size
            )
            for size in sizes
        ]
        return [
            {"pixel_values": pixels[i : i + 1, :k], "image_sizes": sizes[i : i + 1]}
            for i, k in enumerate(counts)
        ]

    def collate_images(self, rows: Sequence[Sequence[Any]]) -> dict[str, torch.Tensor]:
        flat = [im for images in rows for im in images]
        P = max(im["pixel_values"].shape[1] for im in flat)
        first = flat[0]["pixel_values"]
        pixels = first.new_zeros(len(flat), P, *first.shape[2:])  # (n_images, P, 3, H, W); zero patches pad
        for i, im in enumerate(flat):
            pixels[i, : im["pixel_values"].shape[1]] = im["pixel_values"][0]
        return {"pixel_values": pixels, "image_sizes": torch.cat([im["image_sizes"] for im in flat])}


PATCH_RUN_MARKERS = {"internvl": "<IMG_CONTEXT>"}
"""Families whose images are runs of patches flat over the batch, told apart by their token runs."""


class PatchRunBackend(FlatImageBackend):
    """InternVL: an image is a run of patches (its tiles and a thumbnail, by its aspect ratio), each
    ``image_seq_length`` context tokens, between ``<img>`` and ``</img>``; ``pixel_values`` (total patches,
    3, H, W) is flat over the batch. The processor does not return the patches per image, so a segment
    counts them from its ids: each image's run of context tokens over ``image_seq_length``."""

    markers = PATCH_RUN_MARKERS

    def _split(self, out: dict[str, Any], n: int) -> list[dict[str, torch.Tensor]]:
        pixels, proc = out["pixel_values"], self.adapter.processor  # (patches, 3, H, W)
        context, per = proc.image_token_id, proc.image_seq_length
        runs, run = [], 0
        for t in [*out["input_ids"][0].tolist(), None]:
            if t == context:
                run += 1
            elif run:
                runs.append(run)
                run = 0
        counts = [r // per for r in runs]
        if len(counts) != n or sum(counts) != pixels.shape[0] or any(r % per for r in runs):
            raise UserError(
                f"{self.adapter.family}: {n} image(s) and {pixels.shape[0]} patches, but the ids hold image "
                f"token runs of {runs} (image_seq_length {per}); is the processor the model's own?"
            )
        return [{"pixel_values": p} for p in torch.split(pixels, counts)]


TILED_IMAGE_MARKERS = {"idefics3": "<image>", "smolvlm": "<image>"}
"""Families whose images are tiles padded per row (``pixel_attention_mask``), and the processor's marker."""


class TiledImageBackend(AgentBackend):
    """Idefics3-style families: an image is a run of tiles; rows are padded with all-zero tiles.

    A segment keeps one entry per image: its tiles ``pixel_values`` (n_tiles, 3, H, W) and
    ``pixel_attention_mask`` (n_tiles, H, W). A batch stacks each row's tiles in order and pads rows to
    the most tiles (and tile sides) in the batch with zeros, as the processor pads a batch; the model
    drops all-zero tiles and fills its image tokens with the rest, in order.
    """

    def __init__(self, adapter: VLMAdapter) -> None:
        super().__init__(adapter)
        self.marker = TILED_IMAGE_MARKERS[adapter.family]

    def _tiles(self, image: Any) -> int:
        """How many tiles the processor makes of one image (sub-images + the global view)."""
        out = self.adapter.processor.image_processor([[image]], return_tensors="pt")
        return int(out["pixel_values"].shape[1])

    def _segment(self, out: dict[str, Any], images: Sequence[Any]) -> Segment:
        pixels, mask = out["pixel_values"][0], out["pixel_attention_mask"][0]  # (N, 3, H, W), (N, H, W)
        sizes = [self._tiles(im) for im in images]
        if sum(sizes) > pixels.shape[0]:
            raise UserError(
                f"{self.adapter.family}: {len(images)} images make {sum(sizes)} tiles one by one but "
                f"{pixels.shape[0]} together: the processor does not tile each image on its own, which the "
                "agent loop needs to splice zoom images in; try do_image_splitting=false in the folder's "
                "preprocessor_config.json"
            )
        per_image = [
            {"pixel_values": p, "pixel_attention_mask": m}
            for p, m in zip(torch.split(pixels[: sum(sizes)], sizes), torch.split(mask[: sum(sizes)], sizes))
        ]
        return Segment(out["input_ids"][0].tolist(), per_image)

    def prompt(self, images: Sequence[np.ndarray], text: str) -> Segment:
        pil = [_pil(im) for im in images]
        out = self.adapter.build_prompts([Sample(images=pil, text=text)])
        return self._segment({k: v.cpu() for k, v in out.items()}, pil)

    def image_segment(self, image: np.ndarray) -> Segment:
        pil = _pil(image)
        out = self.adapter.processor(
            text=[self.marker], images=[[pil]], return_tensors="pt", add_special_tokens=False
        )
        return self._segment(dict(out), [pil])

    def collate_images(self, rows: Sequence[Sequence[Any]]) -> dict[str, torch.Tensor]:
        flat = [im["pixel_values"] for images in rows for im in images]  # (k, 3, h, w) each
        N = max(sum(im["pixel_values"].shape[0] for im in images) for images in rows)
        B, H, W = len(rows), max(p.shape[-2] for p in flat), max(p.shape[-1] for p in flat)
        pixels = torch.zeros(B, N, 3, H, W, dtype=flat[0].dtype)  # (B, N, 3, H, W); zero tiles are padding
        mask = torch.zeros(B, N, H, W, dtype=torch.long)  # (B, N, H, W)
        for b, images in enumerate(rows):
            n = 0
            for im in images:
                p, m = im["pixel_values"], im["pixel_attention_mask"]  # (k, 3, h, w), (k, h, w)
                k, h, w = p.shape[0], p.shape[-2], p.shape[-1]
                pixels[b, n : n + k, :, :h, :w] = p
                mask[b, n : n + k, :h, :w] = m
                n += k
        return {"pixel_values": pixels, "pixel_attention_mask": mask}


def _pil(image: Any) -> Any:
    return Image.fromarray(image) if isinstance(image, np.ndarray) else image


def backend_for(adapter: VLMAdapter) -> AgentBackend:
    """The agent backend of an adapter's family, or a UserError naming the supported ones."""
    if adapter.family == "notevlm":
        return NoteVLMBackend(adapter)
    if adapter.family in IMAGE_MARKERS:
        return FlatImageBackend(adapter)
    if adapter.family in PATCHED_IMAGE_MARKERS:
        return PatchedImageBackend(adapter)
    if adapter.family in PATCH_RUN_MARKERS:
        return PatchRunBackend(adapter)
    if adapter.family in TILED_IMAGE_MARKERS:
        return TiledImageBackend(adapter)
    done = ", ".join(
        ["notevlm", *IMAGE_MARKERS, *PATCHED_IMAGE_MARKERS, *PATCH_RUN_MARKERS, *TILED_IMAGE_MARKERS]
    )
    raise UserError(
        f"the agent loop does not support family {adapter.family!r}: it needs images spliced into the middle "
        f"of a sequence, done for {done}; a new family needs an AgentBackend (rl/agent/backend.py)"
    )
