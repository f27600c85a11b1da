"""`NoteProcessor`: a note (1-4 images + prompt + optional answer) -> NoteVLM inputs.

Token layout of one sample (the user turn is rendered by the tokenizer's chat template when it has one):

    <user turn: [<im_start> <image> x K <im_end>] per image, then the prompt> <answer tokens> <eos>

Each image becomes exactly K = `tokens_per_image` `<image>` placeholders between `<im_start>` and
`<im_end>` (the per-image index lives in the fusion's index embeddings, LLaVA-style placeholders
otherwise). With ``budget_per="note"`` (a fusion yielding K tokens per note) the note's images become one
block `<im_start> <image> x K <im_end>`, whatever their number. Labels are -100 everywhere except the
answer and its `<eos>`, so only the answer is learned.
A sample longer than `max_length` is cut from the end; if the cut would remove image tokens (or the whole
answer) it is rejected with a :class:`mm.errors.UserError` before any forward pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import PreTrainedTokenizerFast

from mm.data.images import open_rgb
from mm.errors import UserError

IGNORE_INDEX = -100
IMAGE_TOKEN = "<image>"
IM_START_TOKEN = "<im_start>"
IM_END_TOKEN = "<im_end>"
PROCESSOR_FILE = "note_processor.json"
RESIZE_MODES = ("stretch", "pad", "crop")


class NoteProcessor:
    """Tokenizes notes and prepares images for :class:`NoteVLMForConditionalGeneration`.

    Args (keyword-only):
        tokenizer: a `PreTrainedTokenizerFast` with `<pad> <bos> <eos> <image> <im_start> <im_end>`.
        image_size: images are fitted to (image_size, image_size), as ``resize`` says.
        tokens_per_image: K, must equal the model's `fusion_budget`.
        budget_per: "image" (K placeholders per image) or "note" (K per note), the fusion's `budget_per`.
        max_length: longest token sequence; longer samples are cut from the end (never inside images).
        max_images: most images per note (the model's `max_images`).
        image_mean / image_std: per-channel normalisation applied to [0, 1] pixels.
        resize: "stretch" (aspect ignored), "pad" (letterbox: longer side to image_size, aspect kept,
            borders filled with the mean colour, i.e. 0 after normalisation) or "crop" (shorter side to
            image_size, centre crop). Square images come out the same in all three.
    """

    def __init__(
        self,
        *,
        tokenizer: Any,
        image_size: int,
        tokens_per_image: int,
        max_length: int,
        max_images: int = 4,
        image_mean: Sequence[float] = (0.5, 0.5, 0.5),
        image_std: Sequence[float] = (0.5, 0.5, 0.5),
        resize: str = "stretch",
        budget_per: str = "image",
    ) -> None:
        if budget_per not in ("image", "note"):
            raise ValueError(f"NoteProcessor: budget_per must be 'image' or 'note', got {budget_per!r}")
        if resize not in RESIZE_MODES:
            raise ValueError(f"NoteProcessor: resize must be one of {RESIZE_MODES}, got {resize!r}")
        if tokens_per_image < 1 or image_size < 1 or max_length < 1 or max_images < 1:
            raise ValueError(
                "NoteProcessor: image_size, tokens_per_image, max_length and max_images must be >= 1, got "
                f"{image_size}, {tokens_per_image}, {max_length}, {max_images}"
            )
        self.tokenizer = tokenizer
        self.image_size = int(image_size)
        self.tokens_per_image = int(tokens_per_image)
        self.max_length = int(max_length)
        self.max_images = int(max_images)
        self.image_mean = tuple(float(x) for x in image_mean)
        self.image_std = tuple(float(x) for x in image_std)
        self.resize = resize
        self.budget_per = budget_per
        self.image_token_id = self._special_id(IMAGE_TOKEN)
        self.im_start_id = self._special_id(IM_START_TOKEN)
        self.im_end_id = self._special_id(IM_END_TOKEN)
        for name in ("pad_token_id", "eos_token_id"):
            if getattr(tokenizer, name) is None:
                raise ValueError(f"NoteProcessor: the tokenizer has no {name[:-3]}; set one before use")

    def _special_id(self, token: str) -> int:
        tid = self.tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == self.tokenizer.unk_token_id:
            raise ValueError(
                f"NoteProcessor: the tokenizer has no {token!r} token; use "
                "mm.data.tokenizer.load_tokenizer() or add it as a special token"
            )
        return int(tid)

    # --- images ---
    def load_image(self, image: Any) -> torch.Tensor:
        """One image (PIL image, path, HxWx3 uint8 array or (3, H, W) float tensor in [0, 1]) -> (3, S, S)."""
        S = self.image_size
        if isinstance(image, (str, Path)):
            image = open_rgb(image)  # upright, 8-bit, as training decodes files
        if isinstance(image, Image.Image):
            image = image.convert("RGB")
            w, h = image.size
            if self.resize == "stretch" or w == h:
                image = image.resize((S, S), Image.BILINEAR)
            else:
                image = image.resize(_fit_size(h, w, S, self.resize)[::-1], Image.BILINEAR)
            image = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
        elif isinstance(image, np.ndarray):
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
                raise ValueError(f"image arrays must be HxWx3 uint8, got {image.shape} {image.dtype}")
            return self.load_image(Image.fromarray(image))
        elif isinstance(image, torch.Tensor):
            if image.dim() != 3 or image.shape[0] != 3:
                raise ValueError(
                    f"image tensors must be (3, H, W) floats in [0, 1], got {tuple(image.shape)}"
                )
            image = image.float()
            h, w = image.shape[1:]
            size = (S, S) if self.resize == "stretch" or h == w else _fit_size(h, w, S, self.resize)
            if tuple(image.shape[1:]) != size:
                image = torch.nn.functional.interpolate(
                    image[None], size=size, mode="bilinear", align_corners=False
                )[0]
        else:
            raise TypeError(
                f"unsupported image type {type(image).__name__}; pass PIL, a path, ndarray or tensor"
            )
        mean = torch.tensor(self.image_mean).view(3, 1, 1)
        std = torch.tensor(self.image_std).view(3, 1, 1)
        image = _pad_or_crop(image, S, mean)  # (3, S, S); no-op when already square
        return (image - mean) / std  # (3, S, S)

    # --- text ---
    def prompt_ids(self, n_images: int, prompt: str) -> list[int]:
        """Token ids of the user turn (images then prompt) and the assistant prefix, ready for the answer."""
        tok = self.tokenizer
        n_images = 1 if self.budget_per == "note" else n_images  # one block of K for the whole note
        content = IMAGE_TOKEN * n_images + prompt
        if tok.chat_template:
            text = tok.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
            )
            ids = tok(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(content, add_special_tokens=False)["input_ids"]
            if tok.bos_token_id is not None:
                ids = [tok.bos_token_id, *ids]
        if ids.count(self.image_token_id) != n_images:
            raise ValueError(
                f"the chat template/tokenizer turned {n_images} `<image>` markers into "
                f"{ids.count(self.image_token_id)}; `<image>` must be a special token passed through "
                "verbatim (and prompts must not contain it)"
            )
        block = [self.im_start_id, *([self.image_token_id] * self.tokens_per_image), self.im_end_id]
        out: list[int] = []
        for t in ids:
            out.extend(block if t == self.image_token_id else (t,))
        return out

    def encode(
        self, images: Sequence[Any], prompt: str, answer: str | None = None
    ) -> dict[str, torch.Tensor]:
        """One sample: input_ids, attention_mask (T,), pixel_values (n, 3, S, S), labels (T,) if answer."""
        if not 1 <= len(images) <= self.max_images:
            raise UserError(f"a note needs 1..{self.max_images} images, got {len(images)}")
        return self.encode_pixels(torch.stack([self.load_image(im) for im in images]), prompt, answer)

    def encode_pixels(
        self, pixel_values: torch.Tensor, prompt: str, answer: str | None = None
    ) -> dict[str, torch.Tensor]:
        """:meth:`encode` for images already resized and normalised: ``pixel_values`` (n, 3, S, S)."""
        n = len(pixel_values)
        if not 1 <= n <= self.max_images:
            raise UserError(f"a note needs 1..{self.max_images} images, got {n}")
        if tuple(pixel_values.shape[1:]) != (3, self.image_size, self.image_size):
            raise ValueError(
                f"pixel_values must be (n, 3, {self.image_size}, {self.image_size}), got "
                f"{tuple(pixel_values.shape)}; resize images to the processor's image_size"
            )
        ids = self.prompt_ids(n, prompt)
        n_prompt = len(ids)
        if answer is not None:
            ids = (
                ids
                + self.tokenizer(answer, add_special_tokens=False)["input_ids"]
                + [self.tokenizer.eos_token_id]
            )
        if len(ids) > self.max_length:
            last_image = max(i for i, t in enumerate(ids) if t == self.im_end_id)
            if last_image >= self.max_length:
                raise UserError(
                    f"sample needs {last_image + 1} tokens to hold its {n} image(s) "
                    f"({self.tokens_per_image + 2} each) but max_length={self.max_length}: truncation would "
                    "cut image tokens; raise max_length, lower tokens_per_image or use fewer images"
                )
            if answer is not None and n_prompt >= self.max_length:
                raise UserError(
                    f"prompt is {n_prompt} tokens and max_length={self.max_length}: truncation would cut the "
                    "whole answer; raise max_length or shorten the prompt"
                )
            ids = ids[: self.max_length]
        out = {
            "input_ids": torch.tensor(ids, dtype=torch.long),  # (T,)
            "attention_mask": torch.ones(len(ids), dtype=torch.long),  # (T,)
            "pixel_values": pixel_values.float(),  # (n, 3, S, S)
        }
        if answer is not None:
            labels = out["input_ids"].clone()
            labels[:n_prompt] = IGNORE_INDEX
            out["labels"] = labels
        return out

    def encode_note(
        self, note: Any, prompt: str, answer: str | None = None, *, root: str | Path = "."
    ) -> dict[str, torch.Tensor]:
        """:meth:`encode` for an `mm.data.format.Note` (its image paths are relative to ``root``)."""
        return self.encode([Path(root) / im for im in note.images], prompt, answer)

    def encode_item(
        self, item: dict[str, Any], prompt: str, answer: str | None = None
    ) -> dict[str, torch.Tensor]:
        """:meth:`encode_pixels` for a `mm.data.dataset.NoteDataset` item (its ``pixel_values`` as is)."""
        return self.encode_pixels(item["pixel_values"], prompt, answer)

    def collate(
        self, samples: Sequence[dict[str, torch.Tensor]], padding_side: str = "right"
    ) -> dict[str, Any]:
        """Pad samples into a batch: right padding for training, left padding for generation.

        Returns input_ids / attention_mask (B, T), pixel_values (B, N, 3, S, S) with zero padded slots,
        image_mask (B, N) bool, and labels (B, T) when every sample has them.
        """
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if not samples:
            raise ValueError("collate needs at least one sample")
        B = len(samples)
        T = max(len(s["input_ids"]) for s in samples)
        N = max(len(s["pixel_values"]) for s in samples)
        S = self.image_size
        has_labels = all("labels" in s for s in samples)
        input_ids = torch.full((B, T), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros(B, T, dtype=torch.long)
        labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        pixels = torch.zeros(B, N, 3, S, S)
        image_mask = torch.zeros(B, N, dtype=torch.bool)
        for b, s in enumerate(samples):
            L = len(s["input_ids"])
            span = slice(0, L) if padding_side == "right" else slice(T - L, T)
            input_ids[b, span] = s["input_ids"]
            attention[b, span] = 1
            if has_labels:
                labels[b, span] = s["labels"]
            n = len(s["pixel_values"])
            pixels[b, :n] = s["pixel_values"]
            image_mask[b, :n] = True
        batch: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention,
            "pixel_values": pixels,
            "image_mask": image_mask,
        }
        if has_labels:
            batch["labels"] = labels
        return batch

    def __call__(
        self,
        images: Sequence[Sequence[Any]],
        prompts: Sequence[str],
        answers: Sequence[str] | None = None,
        padding_side: str = "right",
    ) -> dict[str, Any]:
        """Encode and collate a batch: ``images[b]`` are note b's images, ``prompts[b]`` its prompt."""
        if len(images) != len(prompts) or (answers is not None and len(answers) != len(prompts)):
            raise ValueError(
                f"images, prompts and answers need one entry per note, got {len(images)}, {len(prompts)}, "
                f"{None if answers is None else len(answers)}"
            )
        samples = [
            self.encode(imgs, p, None if answers is None else answers[i])
            for i, (imgs, p) in enumerate(zip(images, prompts))
        ]
        return self.collate(samples, padding_side=padding_side)

    def batch_decode(self, ids: torch.Tensor, skip_special_tokens: bool = True) -> list[str]:
        """Decode generated ids (B, T) into strings."""
        return self.tokenizer.batch_decode(ids, skip_special_tokens=skip_special_tokens)

    # --- persistence ---
    def to_dict(self) -> dict[str, Any]:
        return {
            "image_size": self.image_size,
            "tokens_per_image": self.tokens_per_image,
            "max_length": self.max_length,
            "max_images": self.max_images,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "resize": self.resize,
            **({"budget_per": self.budget_per} if self.budget_per != "image" else {}),
        }

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the tokenizer files and ``note_processor.json`` into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(d)
        tmp = d / (PROCESSOR_FILE + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(d / PROCESSOR_FILE)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> NoteProcessor:
        """Load a processor written by :meth:`save_pretrained` (offline)."""
        d = Path(directory)
        path = d / PROCESSOR_FILE
        if not path.is_file():
            raise UserError(
                f"{path} not found: save the processor with NoteProcessor.save_pretrained({str(d)!r})"
            )
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(d))
        return cls(tokenizer=tokenizer, **json.loads(path.read_text()))


def _fit_size(h: int, w: int, side: int, mode: str) -> tuple[int, int]:
    """(H', W') keeping the aspect ratio: the longer side = ``side`` for "pad", the shorter for "crop"."""
    scale = side / (max(h, w) if mode == "pad" else min(h, w))
    return max(1, round(h * scale)), max(1, round(w * scale))


def _pad_or_crop(image: torch.Tensor, side: int, fill: torch.Tensor) -> torch.Tensor:
    """(3, H, W) -> (3, side, side): centre crop of a longer side, centred letterbox (``fill`` (3, 1, 1)
    colour) of a shorter one."""
    _, h, w = image.shape
    top, left = (h - side) // 2, (w - side) // 2
    if h > side:
        image = image[:, top : top + side]
    if w > side:
        image = image[:, :, left : left + side]
    if image.shape[1:] == (side, side):
        return image
    canvas = fill.to(image.dtype).expand(3, side, side).clone()  # (3, side, side)
    h, w = image.shape[1:]
    top, left = (side - h) // 2, (side - w) // 2
    canvas[:, top : top + h, left : left + w] = image
    return canvas
