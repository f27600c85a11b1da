"""A labeler VLM that verifies claims with a yes/no question (RLAIF-V, Yu et al. 2024, sec. 3.2).

Each claim becomes a question about the image ("Is there a cup in the image?"); the labeler (any model
:func:`mm.model.adapter.load_adapter` takes, e.g. the policy's own SFT checkpoint: self-feedback) reads
it with the image, and the answer's probability is read off the logits of the next token::

    P(yes) = exp(l_yes) / (exp(l_yes) + exp(l_no))       l: next-token logits after the chat prompt

with ``yes``/``no`` the first tokens of :attr:`LabelerConfig.yes` / :attr:`LabelerConfig.no`
(normalised over the two, so the rest of the vocabulary does not matter). One forward of each left-padded
prompt batch, KV cache off (one token needs no cache), only the last column's logits computed.
Answers are cached on disk by content hash (:class:`LabelCache`: the image pixels + the question + the
model's fingerprint), so a rerun or a repeated claim costs nothing.

Deviation from RLAIF-V: it asks an open question per claim and parses the labeler's generated answer;
here the question is closed and the answer is a probability, so a claim's credit can be graded.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.data.images import open_rgb
from mm.errors import UserError
from mm.model.adapter import Sample
from mm.model.adapter.base import NOT_MODEL_INPUTS


@dataclass(frozen=True, kw_only=True)
class LabelerConfig:
    """The labeler model and how it is asked."""

    model: str = ""
    """Labeler model folder (any :func:`mm.model.adapter.load_adapter` folder); "" = the policy's starting
    checkpoint (self-feedback: a frozen copy of it)."""
    dtype: str | None = None
    """Labeler weights' dtype: None = as saved; float32, bfloat16 or float16."""
    question: str = "Is there a {object} in the image?"
    """Existence question; ``{object}`` is replaced by the claimed object's name."""
    yes: str = "yes"
    """Answer word whose first token is 'yes' (match the labeler's answer style, e.g. "Yes")."""
    no: str = "no"
    """Answer word whose first token is 'no'."""
    answer_style: str = "word"
    """How the labeler answers (mm.train.tasks.yes_no_answer): word (P(yes) is read off the first answer
    token) or object (a NoteVLM trained with ``answer_style: object`` answers "A fork: yes": P(yes) is
    read after the object, from the log probabilities of the two whole answers; needs the claimed object)."""
    batch_size: int = 16
    """Questions per labeler forward."""
    cache: str = ""
    """Folder of the on-disk answer cache ("" = memory only)."""
    threshold: float = 0.5
    """P(yes) at or above which a claim counts as supported (precision/recall; hard credits)."""
    soft: bool = True
    """Credit claims with P(yes) itself (true) or with P(yes) >= threshold (false)."""

    def __post_init__(self) -> None:
        if "{object}" not in self.question:
            raise ValueError(f"labeler.question must contain {{object}}, got {self.question!r}")
        if self.batch_size < 1 or not 0 < self.threshold < 1:
            raise ValueError(
                f"need labeler.batch_size >= 1 and 0 < labeler.threshold < 1, got {self.batch_size}, "
                f"{self.threshold}"
            )
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"labeler.dtype must be null, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.answer_style not in ("word", "object"):
            raise ValueError(f"labeler.answer_style must be word or object, got {self.answer_style!r}")


# ---------------------------------------------------------------- content hashes and the cache


_DIGESTS: dict[int, tuple[weakref.ref, str]] = {}
"""id(PIL image) -> (a weak reference to it, its digest): a rollout asks many questions about one image."""


def image_digest(image: Any) -> str:
    """sha256 of an image's decoded pixels (mode, size, bytes): the same picture hashes the same whatever
    its file format. ``image``: a PIL image (not modified after its first digest) or a path."""
    if isinstance(image, (str, Path)):
        image = open_rgb(image)
    known = _DIGESTS.get(id(image))
    if known is not None and known[0]() is image:
        return known[1]
    h = hashlib.sha256(f"{image.mode}:{image.size}".encode())
    h.update(image.tobytes())
    key = id(image)
    _DIGESTS[key] = (weakref.ref(image, lambda _: _DIGESTS.pop(key, None)), h.hexdigest())
    return _DIGESTS[key][1]


def model_fingerprint(folder: str | Path) -> str:
    """A content id of a model folder: its config.json and each weights file's name, size and sha256 of
    the first and last MiB (cheap on large checkpoints; a retrained folder gets a new id)."""
    d = Path(folder)
    h = hashlib.sha256((d / "config.json").read_bytes() if (d / "config.json").is_file() else b"")
    for f in sorted(d.glob("*.safetensors")) + sorted(d.glob("*.bin")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(size - (1 << 20), 0))
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def question_key(model_id: str, question: str, images: Sequence[Any]) -> str:
    """The cache key of one question: sha256 of the model id, the question and the images' digests."""
    parts = [model_id, question, *(image_digest(im) for im in images)]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


class LabelCache:
    """key -> P(yes), in memory and appended to ``FOLDER/labels.jsonl`` (one ``{"key", "p_yes"}`` a line)."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.path = Path(folder) / "labels.jsonl" if folder else None
        self.values: dict[str, float] = {}
        self.hits = self.misses = 0
        if self.path is not None and self.path.is_file():
            for i, line in enumerate(self.path.read_text().splitlines(), start=1):
                try:
                    rec = json.loads(line)
                    self.values[str(rec["key"])] = float(rec["p_yes"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    raise UserError(
                        f"{self.path}:{i}: not a labeler cache record; delete the file to rebuild the cache"
                    ) from None

    def get(self, key: str) -> float | None:
        value = self.values.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, items: dict[str, float]) -> None:
        self.values.update(items)
        if self.path is not None and items:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.writelines(json.dumps({"key": k, "p_yes": v}) + "\n" for k, v in items.items())


# ---------------------------------------------------------------- the labeler


def answer_token_ids(tokenizer: Any, yes: str, no: str) -> tuple[int, int]:
    """The first token ids of the answer words ``yes`` and ``no``; they must differ."""
    ids = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in (yes, no)]
    if not ids[0] or not ids[1] or ids[0][0] == ids[1][0]:
        raise UserError(
            f"the labeler's tokenizer gives the answers {yes!r} / {no!r} first tokens {ids[0][:1]} / "
            f"{ids[1][:1]}; set labeler.yes / labeler.no to words with distinct first tokens"
        )
    return int(ids[0][0]), int(ids[1][0])


def next_token_logits(adapter: Any, samples: Sequence[Sample]) -> torch.Tensor:
    """``(B, V)`` logits of the token after each sample's chat-template generation prompt (one forward of
    the left-padded batch, KV cache off, only the last column computed)."""
    batch = adapter.build_prompts(samples)  # (B, P) left padded + image inputs
    inputs = {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS}
    positions = adapter.position_ids(batch)
    if positions is not None:
        inputs["position_ids"] = positions  # (B, P), as generate builds them under left padding
    out = adapter.model(**inputs, use_cache=False, logits_to_keep=1)
    return out.logits[:, -1]  # (B, V)


def p_yes_from_logits(logits: torch.Tensor, yes_id: int, no_id: int) -> torch.Tensor:
    """``(B,)`` float64 P(yes) normalised over the two answer tokens, from ``(B, V)`` logits."""
    two = logits[:, [yes_id, no_id]].double()  # (B, 2)
    return torch.softmax(two, dim=-1)[:, 0]


class Labeler:
    """A model that answers yes/no questions with P(yes), batched and cached.

    Args (keyword-only): adapter: a :class:`mm.model.adapter.VLMAdapter` (kept frozen, eval mode);
    cfg: :class:`LabelerConfig`; model_id: the id cache keys use (:func:`model_fingerprint` of its folder).
    """

    def __init__(self, *, adapter: Any, cfg: LabelerConfig, model_id: str) -> None:
        self.adapter, self.cfg = adapter, cfg
        self.model_id = model_id if cfg.answer_style == "word" else f"{model_id}|{cfg.answer_style}"
        for p in adapter.model.parameters():
            p.requires_grad_(False)
        adapter.model.eval()
        self.yes_id, self.no_id = answer_token_ids(adapter.tokenizer, cfg.yes, cfg.no)
        self.cache = LabelCache(cfg.cache or None)

    @classmethod
    def from_folder(cls, folder: str | Path, cfg: LabelerConfig, *, device: Any = "cpu") -> Labeler:
        """Load the labeler model of ``folder`` (:func:`mm.model.adapter.load_adapter`)."""
        from mm.model.adapter import load_adapter

        adapter = load_adapter(folder, device=device, dtype=cfg.dtype)
        return cls(adapter=adapter, cfg=cfg, model_id=model_fingerprint(folder))

    def question(self, obj: str) -> str:
        """The existence question about ``obj``."""
        return self.cfg.question.replace("{object}", obj)

    @torch.no_grad()
    def forward_p_yes(
        self, samples: Sequence[Sample], objects: Sequence[str | None] | None = None
    ) -> list[float]:
        """P(yes) of each sample's question, uncached, in batches of ``cfg.batch_size`` (``objects``: the
        asked object of each, for ``answer_style: object``)."""
        if self.cfg.answer_style == "object":
            return self._forward_object_style(samples, objects)
        out: list[float] = []
        for i in range(0, len(samples), self.cfg.batch_size):
            logits = next_token_logits(self.adapter, samples[i : i + self.cfg.batch_size])  # (b, V)
            out.extend(p_yes_from_logits(logits, self.yes_id, self.no_id).tolist())
        return out

    def _forward_object_style(
        self, samples: Sequence[Sample], objects: Sequence[str | None] | None
    ) -> list[float]:
        """``answer_style: object``: P(yes) = sigmoid(log p("A fork: yes") - log p("A fork: no")), both
        answers without eos (they share the prefix, so this is the two answer tokens' odds after it)."""
        from mm.train.tasks import yes_no_answer

        if objects is None or len(objects) != len(samples) or any(not o for o in objects):
            raise UserError(
                "labeler.answer_style=object reads P(yes) after the asked object, so every question needs "
                "its object (claims do; a free yes/no question does not): use labeler.answer_style=word"
            )
        tok = self.adapter.tokenizer
        out: list[float] = []
        for i in range(0, len(samples), self.cfg.batch_size):
            chunk, objs = list(samples[i : i + self.cfg.batch_size]), objects[i : i + self.cfg.batch_size]
            answers = [
                tok(yes_no_answer(label, o, "object"), add_special_tokens=False)["input_ids"]
                for label in ("yes", "no") for o in objs
            ]  # fmt: skip
            logps, mask = self.adapter.answer_logps(chunk + chunk, answers)  # (2b, T) each
            total = (logps * mask).sum(dim=1).double()  # (2b,)
            b = len(chunk)
            out.extend(torch.sigmoid(total[:b] - total[b:]).tolist())
        return out

    def p_yes(
        self, questions: Sequence[tuple[Sequence[Any], str]], objects: Sequence[str | None] | None = None
    ) -> list[float]:
        """P(yes) for each ``(images, question)`` (PIL images); cached answers are not recomputed.
        ``objects``: the object each question asks about (needed by ``answer_style: object``)."""
        keys = [question_key(self.model_id, q, imgs) for imgs, q in questions]
        values: dict[str, float | None] = {k: self.cache.get(k) for k in dict.fromkeys(keys)}
        todo = [k for k, v in values.items() if v is None]
        if todo:
            first = {k: i for i, k in reversed(list(enumerate(keys)))}
            samples = [Sample(images=list(questions[first[k]][0]), text=questions[first[k]][1]) for k in todo]
            objs = None if objects is None else [objects[first[k]] for k in todo]
            new = dict(zip(todo, self.forward_p_yes(samples, objs)))
            self.cache.put(new)
            values.update(new)
        return [float(values[k]) for k in keys]  # type: ignore[arg-type]

    def verify_objects(self, images: Sequence[Any], objects: Sequence[str]) -> dict[str, float]:
        """object -> P(yes) of "Is there a {object} in the image?" about ``images``."""
        objs = list(dict.fromkeys(objects))
        return dict(zip(objs, self.p_yes([(images, self.question(o)) for o in objs], objs)))

    def supported(self, p: float) -> float:
        """A claim's support in [0, 1]: P(yes) (soft) or 1/0 at the threshold (hard)."""
        return p if self.cfg.soft else float(p >= self.cfg.threshold)
