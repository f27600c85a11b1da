"""What a stage of ``rl agent`` saves of the policy, and how the next stage puts it back.

    state = policy_state(model)          # full state_dict, or under LoRA the trained tensors only
    load_policy_state(model, state)      # strict: every trained tensor, nothing unknown

Without LoRA a stage's ``model.pt`` is the policy's whole ``state_dict`` (as before). Under LoRA
(``lora.enabled``) every stage rebuilds the same base model and adapters (:func:`rl.agent.stages.
build_backend`), so ``model.pt`` holds only the tensors that train: the adapters, the modules PEFT keeps
trainable (a NoteVLM's fusion) and a NoteVLM's image index rows. For a 7B model that is tens of MB a stage
instead of 15 GB, and a checkpoint likewise.
"""

from __future__ import annotations

from typing import Any

import torch

from mm.errors import UserError


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def trained_names(model: torch.nn.Module) -> list[str]:
    """``state_dict`` keys of the parameters that train (``requires_grad``)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def policy_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a stage saves of ``model`` (module docstring), on the CPU."""
    state = model.state_dict()
    if is_peft(model):
        state = {k: state[k] for k in trained_names(model)}
    return {k: v.detach().cpu() for k, v in state.items()}


def load_policy_state(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """Put a :func:`policy_state` back into ``model`` (built the same way); a file from another setup (LoRA on
    or off, other adapters) is a ``UserError``, not a half-loaded policy."""
    setup = "LoRA setup" if is_peft(model) else "one"
    hint = "was lora or the model changed since that stage ran?"
    if is_peft(model):
        want = set(trained_names(model))
        missing, unknown = sorted(want - set(state)), sorted(set(state) - want)
        if missing or unknown:
            raise UserError(
                f"the saved policy does not fit this {setup}: missing {missing[:3]}, unknown {unknown[:3]} "
                f"({len(missing)} and {len(unknown)}); {hint}"
            )
    try:
        model.load_state_dict(state, strict=not is_peft(model))
    except RuntimeError as e:  # keys that fit, shapes that do not (another LoRA rank, another model)
        why = " ".join(str(e).split())[:300]
        raise UserError(f"the saved policy does not fit this {setup} ({why}); {hint}") from None
