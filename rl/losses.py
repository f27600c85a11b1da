"""Post-training losses as pure tensor functions: DPO family, mDPO terms, clipped policy loss,
loss aggregation and the clipped value loss.

Inputs are sequence log-likelihoods ``log pi(y|x)`` (sum of response-token log-probs, see
``rl.logprobs``) for the DPO family, and per-token log-probs with a response mask for the policy
losses. Every function returns tensors (no ``.item()``), so trainers can log them after the step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "AGG_MODES",
    "DPO_LOSS_TYPES",
    "aggregate_loss",
    "bco_running_delta",
    "dpo_loss",
    "mdpo_anchor_loss",
    "mdpo_conditional_loss",
    "policy_loss",
    "value_loss",
]

DPO_LOSS_TYPES = (
    "sigmoid",
    "ipo",
    "hinge",
    "robust",
    "bco_pair",
    "sppo_hard",
    "nca_pair",
    "apo_zero",
    "apo_down",
    "sigmoid_norm",
)
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    loss_type: str = "sigmoid",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
    bco_delta: float | torch.Tensor = 0.0,
    sft_weight: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPO-family loss per preference pair; all log-prob inputs are ``(B,)`` sequence sums.

    With ``c = log pi(y_w) - log pi_ref(y_w)``, ``r = log pi(y_l) - log pi_ref(y_l)``, ``d = c - r``:

    - ``sigmoid``: DPO, Rafailov et al. 2023, eq. 7: ``-log s(beta d)``; with ``label_smoothing = e``
      the conservative cDPO form ``-(1-e) log s(beta d) - e log s(-beta d)`` (Mitchell 2023; TRL 1.16
      ignores ``label_smoothing`` for ``sigmoid``, so it matches TRL only at e = 0).
    - ``ipo``: IPO, Azar et al. 2023, eq. 17: ``(d' - 1/(2 beta))^2`` with ``d'`` the *per-token*
      log-ratio difference (``c / chosen_lengths - r / rejected_lengths``), as TRL.
    - ``hinge``: SLiC-HF, Zhao et al. 2023, eq. 2: ``relu(1 - beta d)``.
    - ``robust``: Chowdhury et al. 2024, "Provably Robust DPO", eq. 8, with flip rate ``label_smoothing``
      (< 0.5): ``((1-e)(-log s(beta d)) - e(-log s(-beta d))) / (1 - 2e)``.
    - ``bco_pair``: BCO, Jung et al. 2024, eq. 6: ``-log s(beta c - delta) - log s(-(beta r - delta))``
      with the running mean reward ``delta = bco_delta`` passed explicitly (update it outside, e.g.
      as the mean of ``beta c`` and ``beta r`` over past batches). TRL 1.16 drops delta: it equals
      this with ``bco_delta = 0``.
    - ``sppo_hard``: SPPO, Wu et al. 2024, eq. 4.7 with hard win probabilities:
      ``(c - 1/(2 beta))^2 + (r + 1/(2 beta))^2``.
    - ``nca_pair``: NCA, Chen et al. 2024, "Noise Contrastive Alignment", pairwise form:
      ``-log s(beta c) - 0.5 log s(-beta c) - 0.5 log s(-beta r)``.
    - ``apo_zero`` / ``apo_down``: APO, D'Oosterlinck et al. 2024, eqs. 7 and 8:
      ``(1 - s(beta c)) + s(beta r)`` and ``s(beta c) + (1 - s(beta d))``.
    - ``sigmoid_norm``: ``-log s(beta d')`` on per-token log-ratios (length-normalised DPO, as TRL).

    ``sft_weight > 0`` adds ``sft_weight`` times the chosen answer's NLL (RPO, Pang et al. 2024) in
    TRL's form: the batch token-mean ``-sum(policy_chosen_logps) / sum(chosen_lengths)``, spread over
    pairs as ``-policy_chosen_logps_i / mean(chosen_lengths)`` so the mean over pairs is exactly TRL's
    ``loss_type=[..., "sft"]`` term.

    Returns:
        ``(loss, chosen_rewards, rejected_rewards)``, each ``(B,)``; rewards are ``beta * c`` and
        ``beta * r``, detached (the implicit rewards TRL logs). The training loss is ``loss.mean()``.
    """
    inputs = (policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    if any(t.dim() != 1 or t.shape != policy_chosen_logps.shape for t in inputs):
        raise ValueError(
            "dpo_loss expects four (B,) sequence log-prob tensors of the same shape; got "
            f"{[tuple(t.shape) for t in inputs]}"
        )
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; expected one of {DPO_LOSS_TYPES}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    length_normalised = loss_type in ("ipo", "sigmoid_norm")
    if ((length_normalised or sft_weight > 0) and chosen_lengths is None) or (
        length_normalised and rejected_lengths is None
    ):
        raise ValueError(
            f"loss_type={loss_type!r} with sft_weight={sft_weight} needs chosen_lengths "
            "(and rejected_lengths for ipo/sigmoid_norm): the number of response tokens of each answer"
        )
    chosen_ratio = policy_chosen_logps - ref_chosen_logps  # (B,)
    rejected_ratio = policy_rejected_logps - ref_rejected_logps  # (B,)
    delta = chosen_ratio - rejected_ratio  # (B,)

    if loss_type in ("ipo", "sigmoid_norm"):
        chosen_norm = chosen_ratio / chosen_lengths.clamp(min=1)  # (B,) per-token log-ratio
        norm_delta = chosen_norm - rejected_ratio / rejected_lengths.clamp(min=1)
    if loss_type == "sigmoid":
        e = label_smoothing
        loss = -(1 - e) * F.logsigmoid(beta * delta) - e * F.logsigmoid(-beta * delta)
    elif loss_type == "ipo":
        loss = (norm_delta - 1 / (2 * beta)) ** 2
    elif loss_type == "hinge":
        loss = torch.relu(1 - beta * delta)
    elif loss_type == "robust":
        e = label_smoothing
        loss = (-(1 - e) * F.logsigmoid(beta * delta) + e * F.logsigmoid(-beta * delta)) / (1 - 2 * e)
    elif loss_type == "bco_pair":
        chosen_term = -F.logsigmoid(beta * chosen_ratio - bco_delta)
        loss = chosen_term - F.logsigmoid(-(beta * rejected_ratio - bco_delta))
    elif loss_type == "sppo_hard":
        loss = (chosen_ratio - 0.5 / beta) ** 2 + (rejected_ratio + 0.5 / beta) ** 2
    elif loss_type == "nca_pair":
        loss = (
            -F.logsigmoid(beta * chosen_ratio)
            - 0.5 * F.logsigmoid(-beta * chosen_ratio)
            - 0.5 * F.logsigmoid(-beta * rejected_ratio)
        )
    elif loss_type == "apo_zero":
        loss = (1 - torch.sigmoid(beta * chosen_ratio)) + torch.sigmoid(beta * rejected_ratio)
    elif loss_type == "apo_down":
        loss = torch.sigmoid(beta * chosen_ratio) + (1 - torch.sigmoid(beta * delta))
    else:  # sigmoid_norm
        loss = -F.logsigmoid(beta * norm_delta)

    if sft_weight > 0:
        mean_len = chosen_lengths.to(policy_chosen_logps.dtype).mean().clamp(min=1.0)
        loss = loss + sft_weight * (-policy_chosen_logps / mean_len)
    return loss, (beta * chosen_ratio).detach(), (beta * rejected_ratio).detach()


def bco_running_delta(
    mean: float, count: int, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor
) -> tuple[float, int]:
    """Update BCO's running reward mean ``delta`` with a batch's implicit rewards: ``-> (mean, count)``.

    Jung et al. 2024 (BCO), sec. 3.2: ``delta`` is the running mean of ``beta * log pi/pi_ref`` over all
    chosen and rejected answers seen so far (TRL <= 0.11 kept it in ``RunningMoments``). Start from
    ``(0.0, 0)``; pass the returned mean as ``dpo_loss(..., loss_type="bco_pair", bco_delta=mean)``.
    """
    batch = torch.cat([chosen_rewards.detach().reshape(-1), rejected_rewards.detach().reshape(-1)])
    n = batch.numel()
    if n == 0:
        return mean, count
    total = count + n
    return mean + (float(batch.double().mean()) - mean) * n / total, total


def mdpo_conditional_loss(
    policy_chosen_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    policy_chosen_corrupt_logps: torch.Tensor,
    ref_chosen_corrupt_logps: torch.Tensor,
    *,
    beta: float = 0.1,
) -> torch.Tensor:
    """mDPO's image-conditional preference term per pair ``(B,)``.

    Wang et al. 2024, "mDPO: Conditional Preference Optimization for Multimodal Large Language
    Models", eq. 4: the *same* chosen answer ``y_w`` is preferred under the true image ``m_w`` over a
    corrupted image ``m_l``:
    ``-log s(beta (log pi(y_w|m_w)/pi_ref(y_w|m_w) - log pi(y_w|m_l)/pi_ref(y_w|m_l)))``.
    ``*_corrupt_logps`` are the chosen answer's sequence log-probs with the corrupted image(s).
    """
    real = policy_chosen_logps - ref_chosen_logps  # (B,)
    corrupt = policy_chosen_corrupt_logps - ref_chosen_corrupt_logps  # (B,)
    return -F.logsigmoid(beta * (real - corrupt))


def mdpo_anchor_loss(
    policy_chosen_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    delta: float = 0.0,
) -> torch.Tensor:
    """mDPO's reward anchor per pair ``(B,)``: ``-log s(beta log pi(y_w)/pi_ref(y_w) - delta)``.

    Wang et al. 2024 (mDPO), eq. 5: keeps the chosen answer's implicit reward above ``delta`` (0 in the
    paper) so DPO cannot lower the likelihood of both answers. mDPO's objective is
    ``dpo + conditional + anchor``, each averaged over pairs.
    """
    return -F.logsigmoid(beta * (policy_chosen_logps - ref_chosen_logps) - delta)


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, *, mode: str = "token-mean", horizon: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss ``(B, T)`` (or ``(B, 1)``, broadcast) over the masked tokens to a scalar.

    verl's ``agg_loss`` names and semantics (single process):

    - ``token-mean``: sum over all masked tokens / number of masked tokens (DAPO, Yu et al. 2025,
      eq. 12; TRL ``loss_type="bnpo"``/``"dapo"``).
    - ``seq-mean-token-mean``: mean over tokens in each sequence, then over sequences (GRPO paper,
      TRL ``loss_type="grpo"``).
    - ``seq-mean-token-sum``: token sum per sequence, mean over sequences (TRL ``"luspo"``).
    - ``seq-mean-token-sum-norm``: token sum per sequence / ``horizon`` (default ``T``, the padded
      length; set it to the max completion length for a constant), mean over sequences (Dr. GRPO,
      Liu et al. 2025; TRL ``"dr_grpo"`` divides by ``B * max_completion_length``).

    Sequences whose mask is all 0 are excluded from the sequence mean (verl); TRL still counts them
    in ``B``. An all-zero mask gives 0, not NaN (verl's ``token-mean`` would give NaN).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGG_MODES}")
    if mask.dim() != 2 or loss_mat.dim() != 2 or loss_mat.shape[0] != mask.shape[0]:
        raise ValueError(
            f"expected loss_mat and mask of shape (B, T); got {tuple(loss_mat.shape)}, {tuple(mask.shape)}"
        )
    m = mask.to(loss_mat.dtype)  # (B, T)
    token_sums = (loss_mat * m).sum(-1)  # (B,)
    if mode == "token-mean":
        return token_sums.sum() / m.sum().clamp(min=1.0)
    seq_tokens = m.sum(-1)  # (B,)
    n_seqs = (seq_tokens > 0).to(loss_mat.dtype).sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        return (token_sums / seq_tokens.clamp(min=1.0)).sum() / n_seqs
    if mode == "seq-mean-token-sum":
        return token_sums.sum() / n_seqs
    return token_sums.sum() / n_seqs / (mask.shape[-1] if horizon is None else horizon)


def token_advantages(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    expand: bool = True,
) -> torch.Tensor:
    """Check the shapes of a policy-loss batch (``logps``, ``old_logps``, ``mask``: ``(B, T)``; advantages
    ``(B,)`` or ``(B, T)``) and return the advantages as ``(B, T)`` (``expand``) or ``(B, 1)``/``(B, T)``."""
    if logps.shape != old_logps.shape or logps.shape != mask.shape or logps.dim() != 2:
        raise ValueError(
            f"logps, old_logps and mask must all be (B, T); got {tuple(logps.shape)}, "
            f"{tuple(old_logps.shape)}, {tuple(mask.shape)}"
        )
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (B, 1)
    if advantages.shape not in ((logps.shape[0], 1), logps.shape):
        raise ValueError(
            f"advantages must be (B,) or (B, T) with (B, T) = {tuple(logps.shape)}; "
            f"got {tuple(advantages.shape)}"
        )
    return advantages.expand(logps.shape) if expand else advantages


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    level: str = "token",
    agg: str = "token-mean",
    horizon: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate policy loss (PPO / GRPO / DAPO / GSPO), aggregated to a scalar.

    PPO-clip (Schulman et al. 2017, eq. 7): ``max(-A w, -A clip(w, 1-eps_low, 1+eps_high))`` per token.

    - ``eps_high != eps_low``: DAPO's clip-higher (Yu et al. 2025, eq. 10); default ``eps_high = eps_low``.
    - ``dual_clip = c > 1``: dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games",
      eq. 5): for ``A < 0`` the loss is also capped at ``-A c``, as verl's ``clip_ratio_c``. Equals TRL's
      ``delta`` (two-sided clipping) whenever ``c >= 1 + eps_high``.
    - ``level="token"``: ``w_t = pi(y_t)/pi_old(y_t)`` (GRPO, Shao et al. 2024). ``level="sequence"``:
      GSPO (Zheng et al. 2025, eq. 7), ``w = exp(mean_t log(pi/pi_old))`` over the response tokens,
      one ratio per sequence, as TRL's ``importance_sampling_level="sequence"`` (verl's token-level
      stop-gradient form has the same value and gradient). GSPO pairs with ``seq-mean-token-mean``.

    Log-ratios are clamped to [-20, 20] before ``exp`` as in verl (TRL does not clamp).

    Args:
        logps: ``(B, T)`` current policy log-probs of the sampled tokens (with grad).
        old_logps: ``(B, T)`` log-probs at sampling time (detached).
        advantages: ``(B,)`` per sequence or ``(B, T)`` per token.
        mask: ``(B, T)`` response mask.
        agg, horizon: see :func:`aggregate_loss`.

    Returns:
        ``(loss, metrics)``; metrics (detached scalars): ``clip_frac_low`` (ratio below ``1-eps_low`` with
        ``A < 0``), ``clip_frac_high`` (above ``1+eps_high`` with ``A > 0``), ``clip_frac_dual``
        (``A < 0`` and ratio above ``c``), as fractions of response tokens (of sequences for
        ``level="sequence"``, as TRL), and ``approx_kl`` = masked mean of ``log pi_old - log pi``.
    """
    eps_high = eps_low if eps_high is None else eps_high
    advantages = token_advantages(logps, old_logps, advantages, mask, expand=False)  # (B, 1) or (B, T)
    if not (0 <= eps_low < 1 and eps_high >= 0):
        raise ValueError(
            f"need 0 <= eps_low < 1 and eps_high >= 0; got eps_low={eps_low}, eps_high={eps_high}"
        )
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip (verl clip_ratio_c) must be > 1, got {dual_clip}")
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")

    m = mask.to(logps.dtype)
    log_ratio = logps - old_logps  # (B, T)
    if level == "sequence":
        log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # (B, 1)
    ratio = torch.exp(log_ratio.clamp(min=-20.0, max=20.0))  # (B, T) or (B, 1)
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    per_token = torch.maximum(-advantages * ratio, -advantages * clipped)  # (B, T) or (B, 1)
    neg = advantages < 0
    if dual_clip is not None:
        per_token = torch.where(neg, torch.minimum(per_token, -advantages * dual_clip), per_token)
    loss = aggregate_loss(per_token.expand(mask.shape), mask, mode=agg, horizon=horizon)

    with torch.no_grad():
        low = (ratio < 1 - eps_low) & neg
        high = (ratio > 1 + eps_high) & (advantages > 0)
        dual = neg & (ratio > dual_clip) if dual_clip is not None else torch.zeros_like(low)

        def frac(flag: torch.Tensor) -> torch.Tensor:
            if flag.shape[-1] == 1 and mask.shape[-1] != 1:  # one ratio and advantage per sequence
                return _mean_over(flag.squeeze(-1).to(logps.dtype), m.sum(-1) > 0)
            return _mean_over(flag.expand(mask.shape).to(logps.dtype), mask.bool())

        metrics = {
            "clip_frac_low": frac(low),
            "clip_frac_high": frac(high),
            "clip_frac_dual": frac(dual),
            "approx_kl": _mean_over(old_logps - logps, mask.bool()),
        }
    return loss, metrics


def _mean_over(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    k = keep.to(values.dtype)
    return (values * k).sum() / k.sum().clamp(min=1.0)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_range: float | None = 0.2,
    agg: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss ``0.5 * agg(max((V - R)^2, (V_clip - R)^2))``, ``V_clip = old + clip(V - old, c)``.

    PPO value clipping (Schulman et al. 2017 / OpenAI baselines ``ppo2``), as verl's
    ``compute_value_loss``; ``clip_range=None`` gives the plain squared error. All inputs ``(B, T)``.

    Returns:
        ``(loss, clip_frac)``: scalar loss and the fraction of response tokens where the clipped term won.
    """
    if not (values.shape == old_values.shape == returns.shape == mask.shape):
        raise ValueError(
            "values, old_values, returns and mask must all be (B, T); got "
            f"{[tuple(t.shape) for t in (values, old_values, returns, mask)]}"
        )
    err = (values - returns) ** 2  # (B, T)
    if clip_range is None:
        return 0.5 * aggregate_loss(err, mask, mode=agg), values.new_zeros(())
    v_clip = old_values + (values - old_values).clamp(-clip_range, clip_range)
    err_clip = (v_clip - returns) ** 2
    loss = 0.5 * aggregate_loss(torch.maximum(err, err_clip), mask, mode=agg)
    return loss, _mean_over((err_clip > err).to(values.dtype).detach(), mask.bool())
