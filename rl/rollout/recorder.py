"""Log-probs of the tokens HF ``generate`` samples, under the distribution it sampled them from.

``generate`` runs its warpers (temperature, top-k, top-p) *after* any custom logits processor, so a
processor cannot see the final distribution. :func:`sampling_processors` therefore asks ``generate``
for no warpers (``temperature=1, top_k=0, top_p=1``) and passes HF's own warpers, in HF's order, as
custom processors followed by :class:`LogprobRecorder`: the tokens are drawn from exactly the
distribution ``generate(temperature=T, top_k=k, top_p=p)`` uses, and the recorder sees it.
"""

from __future__ import annotations

from typing import Any

import torch

from mm.errors import UserError

# generation-config warpers generate would still append after the custom processors, with their "off" values
_LATE_WARPERS: dict[str, tuple[Any, ...]] = {
    "min_p": (None,),
    "top_h": (None,),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "watermarking_config": (None,),
}


class LogprobRecorder:
    """A logits processor that keeps ``log_softmax(scores)`` of each step and, at the next call (or in
    :meth:`finish`), the log-prob of the token that step drew. Memory: one ``(N, V)`` step at a time."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.steps: dict[int, torch.Tensor] = {}  # step -> (N,) log-probs of the drawn tokens
        self.last: tuple[int, torch.Tensor] | None = None  # (step, (N, V) log-probs)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        if self.start is None:
            self.start = length
        if self.last is not None:  # input_ids[:, -1] is the token the previous step drew
            step, logp = self.last
            self.steps[step] = logp.gather(-1, input_ids[:, -1:]).squeeze(-1)  # (N,)
        self.last = (length - self.start, torch.log_softmax(scores.float(), dim=-1))  # (N, V)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """``(N, R)`` log-probs of ``new_tokens`` ``(N, R)`` (the generated columns); NaN for a step never
        seen (cannot happen with ``generate``'s sampling loop)."""
        N, R = new_tokens.shape
        out = torch.full((N, R), float("nan"), device=new_tokens.device)
        for step, lp in self.steps.items():
            if step < R:
                out[:, step] = lp
        if self.last is not None and self.last[0] < R and self.last[0] not in self.steps:
            step, logp = self.last
            out[:, step] = logp.gather(-1, new_tokens[:, step : step + 1]).squeeze(-1)
        self.last = None
        return out


def sampling_processors(
    model: Any, *, temperature: float, top_k: int, top_p: float, sampler: Any = None
) -> tuple[dict[str, Any], LogprobRecorder]:
    """``generate`` keyword arguments that sample at ``temperature`` / ``top_k`` / ``top_p`` through custom
    warpers ending in a :class:`LogprobRecorder`, and that recorder. ``sampler`` (a
    :class:`rl.rollout.seeded.SeededSampler`) goes last: it draws the tokens from per-prompt generators."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    gc = model.generation_config
    late = [k for k, off in _LATE_WARPERS.items() if getattr(gc, k, None) not in off]
    if late:
        raise UserError(
            f"the model's generation_config sets {late}: their warpers would run after the rollout's "
            "log-prob recorder; set them to their neutral values in generation_config.json"
        )
    warpers: list[Any] = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p))
    recorder = LogprobRecorder()
    kwargs = {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "logits_processor": LogitsProcessorList([*warpers, recorder, *([sampler] if sampler else [])]),
    }
    return kwargs, recorder
