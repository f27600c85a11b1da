"""A Bradley-Terry reward model: a scalar value head on a VLM's last hidden state (``rl rm``).

``r(x, y) = w . h_L(x, y)[last] + b``: ``h_L`` the model's last hidden layer over the chat-template prompt
(images + question) and the answer (its tokens + eos), read at the last non-padding token (the eos), as
InstructGPT (Ouyang et al. 2022) and TRL's ``RewardTrainer`` (a sequence-classification head on the last
token). The VLM is any model :func:`mm.model.adapter.load_adapter` takes; LoRA or full fine-tuning.

Bradley-Terry loss on pairs (chosen ``c``, rejected ``j``): ``-log sigmoid(r_c - r_j)`` averaged, plus
``center_weight * mean((r_c + r_j)^2)`` (TRL's ``center_rewards_coefficient``, Eisenstein et al. 2023)
that pins the reward's free offset.

Saved layout of DIR: ``DIR/model`` (the VLM folder, LoRA merged; ``DIR/adapter`` the LoRA),
``DIR/value_head.pt`` (the head's state dict, float32) and ``DIR/reward_model.json`` (hidden size).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mm.errors import UserError
from mm.model.adapter import Sample
from mm.model.adapter.base import NOT_MODEL_INPUTS


def bt_loss(chosen: torch.Tensor, rejected: torch.Tensor, *, center_weight: float = 0.0) -> torch.Tensor:
    """Bradley-Terry loss ``mean(-log sigmoid(r_c - r_j)) + center_weight * mean((r_c + r_j)^2)`` of
    ``(B,)`` rewards."""
    if chosen.shape != rejected.shape or chosen.ndim != 1:
        raise ValueError(f"need (B,) chosen and rejected rewards, got {tuple(chosen.shape)}, "
                         f"{tuple(rejected.shape)}")  # fmt: skip
    loss = -F.logsigmoid(chosen - rejected).mean()
    if center_weight:
        loss = loss + center_weight * (chosen + rejected).pow(2).mean()
    return loss


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` index of each row's last attended column of a ``(B, T)`` mask (prompts left padded, answers
    right padded)."""
    T = attention_mask.shape[1]
    return T - 1 - attention_mask.flip(1).to(torch.long).argmax(1)


def hidden_size(model: Any) -> int:
    """Width of the LM's hidden states (its input embedding width)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return int(base.get_input_embeddings().embedding_dim)


class RewardModel(torch.nn.Module):
    """A VLM (through its adapter) and a linear value head; ``forward(batch) -> (B,)`` rewards.

    Args (keyword-only): adapter: a :class:`mm.model.adapter.VLMAdapter`; head: ``Linear(H, 1)`` (None = a
    fresh zero-initialised one, so every answer starts at reward 0, with its bias frozen at 0).
    """

    def __init__(self, *, adapter: Any, head: torch.nn.Linear | None = None) -> None:
        super().__init__()
        self.adapter = adapter
        self.backbone = adapter.model  # registered, so parameters() and state_dict() cover it
        if head is None:
            head = torch.nn.Linear(hidden_size(adapter.model), 1)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
            # the Bradley-Terry loss is shift-invariant, so the bias has no gradient but float noise, which
            # AdamW would turn into a move of about lr a step: it stays 0
            head.bias.requires_grad_(False)
        self.head = head.to(device=adapter.device, dtype=torch.float32)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """``(B,)`` float32 rewards of a batch from :meth:`VLMAdapter.answer_batch` (prompt + answer rows)."""
        inputs = {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS and k != "num_pairs"}
        positions = self.adapter.position_ids(batch)
        if positions is not None:
            inputs["position_ids"] = positions
        out = self.backbone(**inputs, use_cache=False, output_hidden_states=True, logits_to_keep=1)
        h = out.hidden_states[-1]  # (B, T, H)
        last = last_token_index(batch["attention_mask"])  # (B,)
        pooled = h[torch.arange(h.shape[0], device=h.device), last]  # (B, H)
        return self.head(pooled.float()).squeeze(-1)  # (B,)

    @torch.no_grad()
    def score(
        self, samples: Sequence[Sample], answers: Sequence[str], *, batch_size: int = 16
    ) -> list[float]:
        """Rewards of ``answers`` to ``samples`` (eval mode, batched)."""
        was = self.training
        self.eval()
        try:
            out: list[float] = []
            for i in range(0, len(samples), batch_size):
                batch = self.adapter.answer_batch(samples[i : i + batch_size], answers[i : i + batch_size])
                out.extend(self(batch).tolist())
            return out
        finally:
            self.train(was)

    def save_head(self, out: Path) -> None:
        """``OUT/value_head.pt`` and ``OUT/reward_model.json`` (the VLM is saved by the trainer)."""
        torch.save({k: v.float().cpu() for k, v in self.head.state_dict().items()}, out / "value_head.pt")
        meta = {"hidden_size": self.head.in_features, "model": "model", "kind": "bradley-terry"}
        (out / "reward_model.json").write_text(json.dumps(meta, indent=1))


def load_reward_model(folder: str | Path, *, device: Any = "cpu", dtype: Any = None) -> RewardModel:
    """The reward model ``rl rm`` wrote to ``folder`` (frozen, eval mode)."""
    from mm.model.adapter import load_adapter

    d = Path(folder)
    meta_path = d / "reward_model.json"
    if not meta_path.is_file() or not (d / "value_head.pt").is_file():
        raise UserError(
            f"{d} is not a reward model folder (reward_model.json + value_head.pt + model/); train one with "
            "`rl rm --model DIR --pairs PAIRS.jsonl --out DIR`"
        )
    meta = json.loads(meta_path.read_text())
    adapter = load_adapter(d / meta["model"], device=device, dtype=dtype)
    head = torch.nn.Linear(int(meta["hidden_size"]), 1)
    head.load_state_dict(torch.load(d / "value_head.pt", map_location="cpu"))
    rm = RewardModel(adapter=adapter, head=head)
    for p in rm.parameters():
        p.requires_grad_(False)
    return rm.eval()
