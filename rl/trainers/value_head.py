"""The critic of ``rl ppo``: a linear value head on a NoteVLM's last hidden state.

``V(s_t) = w . h_L(s_t) + b`` with ``h_L`` the last (normed) hidden layer at the position *before* response
token ``t`` (the state the token is chosen in), as TRL's PPO value head and verl's critic
(``values[:, -R - 1 : -1]``). Two layouts (``critic:``):

- ``shared``: the head sits on the policy's own trunk; one forward gives the log-probs and the values, and
  the value loss trains the trunk too (the value loss weight ``ppo.vf_coef`` balances the two);
- ``separate``: a second NoteVLM built from the same checkpoint carries the head; policy and critic share no
  weight (two forwards per update).

:class:`ActorCritic` holds policy, head and critic as one module, so the training skeleton
(:mod:`mm.train.loop`) optimises, clips, checkpoints and resumes them together (TRL's
``PolicyAndValueWrapper``). Saved layout beside the policy's ``OUT/model``: ``OUT/value_head.pt`` (the head's
float32 state dict), ``OUT/value_head.json`` (critic kind, hidden size) and, for ``separate``,
``OUT/critic/model`` (the critic folder, LoRA merged); :func:`load_value_head` reads them back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from rl.trainers.common import MODEL_KEYS, batch_token_logps, response_window, save_final
from rl.trainers.rm_model import hidden_size

CRITIC_KINDS = ("shared", "separate")
"""Where the value head sits: on the policy's trunk, or on a separate critic model."""


def value_head(width: int, *, std: float = 0.02) -> torch.nn.Linear:
    """``Linear(width, 1)`` with weights ``N(0, std^2)`` (transformers' ``initializer_range``, as a fresh
    verl critic head) and bias 0: small values at the start, yet a nonzero gradient into the trunk from the
    first update (a zero head would block it)."""
    head = torch.nn.Linear(width, 1)
    torch.nn.init.normal_(head.weight, std=std)
    torch.nn.init.zeros_(head.bias)
    return head


def response_values(hidden: torch.Tensor, start: int, head: torch.nn.Module) -> torch.Tensor:
    """``(B, T, H)`` last hidden states -> ``(B, W)`` values (the head's dtype) of the states before tokens
    ``start .. T-1`` (``W = T - start``), aligned with :func:`rl.trainers.common.batch_token_logps`."""
    h = hidden[:, start - 1 : -1]  # (B, W, H): position start-1+w precedes token start+w
    return head(h.to(head.weight.dtype)).squeeze(-1)  # (B, W)


class _HiddenCapture:
    """Calls the model with ``output_hidden_states=True`` and keeps the last hidden layer ``(B, T, H)``."""

    def __init__(self, model: Any) -> None:
        self.model, self.hidden = model, None

    def __call__(self, **kwargs: Any) -> Any:
        out = self.model(**kwargs, output_hidden_states=True)
        self.hidden = out.hidden_states[-1]  # (B, T, H), after the final norm
        return out


class ActorCritic(torch.nn.Module):
    """Policy, value head and (``separate``) critic model as one module.

    Args (keyword-only): policy: the NoteVLM being trained; head: ``Linear(H, 1)``; critic: None for the
    ``shared`` layout, else the critic NoteVLM (same hidden width as ``head``).
    """

    def __init__(self, *, policy: Any, head: torch.nn.Linear, critic: Any = None) -> None:
        super().__init__()
        width = hidden_size(policy if critic is None else critic)
        if head.in_features != width:
            raise ValueError(f"value head takes {head.in_features} features but the trunk is {width} wide")
        self.policy, self.head, self.critic = policy, head, critic

    @property
    def kind(self) -> str:
        """``shared`` or ``separate`` (:data:`CRITIC_KINDS`)."""
        return "shared" if self.critic is None else "separate"

    def forward(
        self, batch: dict[str, torch.Tensor], *, temperature: float = 1.0, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``(logps, mask, entropy, values)`` of a rollout batch, each ``(B, W)``: the policy's as
        :func:`rl.trainers.common.batch_token_logps` and the critic's values of the same positions."""
        start = response_window(batch["response_mask"])
        if self.critic is None:
            capture = _HiddenCapture(self.policy)
            logps, mask, entropy = batch_token_logps(
                capture, batch, temperature=temperature, with_entropy=with_entropy
            )
            return logps, mask, entropy, response_values(capture.hidden, start, self.head)
        logps, mask, entropy = batch_token_logps(
            self.policy, batch, temperature=temperature, with_entropy=with_entropy
        )
        return logps, mask, entropy, self.values(batch)

    def values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``(B, W)`` values alone (one trunk forward, the logits of one position only)."""
        start = response_window(batch["response_mask"])
        trunk = self.policy if self.critic is None else self.critic
        attn = batch["attention_mask"]
        extra = {k: batch[k] for k in MODEL_KEYS if k in batch}
        out = trunk(
            input_ids=batch["input_ids"], attention_mask=attn,
            position_ids=(attn.long().cumsum(-1) - 1).clamp(min=0), logits_to_keep=1, use_cache=False,
            output_hidden_states=True, **extra,
        )  # fmt: skip
        return response_values(out.hidden_states[-1], start, self.head)


def save_value_head(model: ActorCritic, processor: Any, out: Path, *, lora: bool) -> None:
    """``OUT/value_head.pt`` + ``OUT/value_head.json`` and, for ``separate``, ``OUT/critic/model`` (LoRA
    merged: call after the last forward)."""
    head = {k: v.float().cpu() for k, v in model.head.state_dict().items()}
    torch.save(head, out / "value_head.pt")
    meta = {"critic": model.kind, "hidden_size": model.head.in_features, "critic_model": None}
    if model.critic is not None:
        save_final(model.critic, processor, out / "critic", lora=lora)
        meta["critic_model"] = "critic/model"
    (out / "value_head.json").write_text(json.dumps(meta, indent=1))


def load_value_head(folder: str | Path, *, device: Any = "cpu") -> tuple[torch.nn.Linear, Any]:
    """``(head, critic)`` saved by :func:`save_value_head` in ``folder`` (``critic`` None for ``shared``:
    put the head on the policy in ``folder/model``)."""
    d = Path(folder)
    if not (d / "value_head.json").is_file() or not (d / "value_head.pt").is_file():
        raise UserError(
            f"{d} has no value head (value_head.json + value_head.pt); it is written by `rl ppo --out {d}`"
        )
    meta = json.loads((d / "value_head.json").read_text())
    head = torch.nn.Linear(int(meta["hidden_size"]), 1)
    head.load_state_dict(torch.load(d / "value_head.pt", map_location="cpu"))
    critic = None
    if meta["critic_model"] is not None:
        from mm.model import NoteVLMForConditionalGeneration

        critic = NoteVLMForConditionalGeneration.from_pretrained(str(d / meta["critic_model"])).to(device)
    return head.to(device), critic
