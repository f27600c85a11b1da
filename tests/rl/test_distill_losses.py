"""rl.distill_losses: golden values (float64), TRL's GKD generalised JSD (a transcription, and the installed
function when trl imports) to 1e-6 on random inputs, the sampled reverse-KL advantage and its gradient."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rl.distill_losses import (
    generalized_jsd_loss,
    gjsd_loss,
    gjsd_terms,
    reverse_kl_advantages,
    reverse_kl_loss,
    reverse_kl_per_token,
    sampled_kl_loss,
    sft_loss,
)

D = torch.float64
P_S, P_T = [0.5, 0.5], [0.9, 0.1]
# KL(s||t) = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1); KL(t||s) = 0.9 ln(0.9/0.5) + 0.1 ln(0.1/0.5);
# JSD_0.5 and JSD_0.25 with m = beta p_t + (1 - beta) p_s, computed by hand in float64.
REVERSE_KL, FORWARD_KL = 0.5108256237659907, 0.3680642071684971
JSD = {0.5: 0.10174922507919676, 0.25: 0.07188053824143541}


def trl_generalized_jsd_loss(
    student_logits, teacher_logits, labels=None, beta=0.5, temperature=1.0, reduction="batchmean",
    num_items_in_batch=None,
):  # fmt: skip
    """Transcription of TRL 1.16 ``GKDTrainer.generalized_jsd_loss`` (trl/experimental/gkd/gkd_trainer.py)."""
    student_logits = student_logits / temperature
    teacher_logits = teacher_logits / temperature
    student_log_probs = F.log_softmax(student_logits, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits, dim=-1)
    if beta == 0:
        jsd = F.kl_div(student_log_probs, teacher_log_probs, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
    else:
        beta = torch.tensor(beta, dtype=student_log_probs.dtype, device=student_log_probs.device)
        mixture_log_probs = torch.logsumexp(
            torch.stack([student_log_probs + torch.log1p(-beta), teacher_log_probs + torch.log(beta)]),
            dim=0,
        )
        kl_teacher = F.kl_div(mixture_log_probs, teacher_log_probs, reduction="none", log_target=True)
        kl_student = F.kl_div(mixture_log_probs, student_log_probs, reduction="none", log_target=True)
        jsd = beta * kl_teacher + (1 - beta) * kl_student
    if labels is not None:
        mask = labels != -100
        jsd = jsd[mask]
    if num_items_in_batch is not None:
        jsd_sum = jsd.sum()
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(jsd_sum.device)
        return jsd_sum / num_items_in_batch
    if reduction == "batchmean":
        denom = mask.sum().clamp_min(1) if labels is not None else max(jsd.size(0), 1)
        return jsd.sum() / denom
    elif reduction == "sum":
        return jsd.sum()
    elif reduction == "mean":
        return jsd.mean()
    else:
        return jsd


def _logits(p):
    return torch.tensor([[[math.log(x) for x in p]]], dtype=D)  # (1, 1, 2)


def _random(seed=0, B=3, W=5, V=11, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, W, V, generator=g, dtype=D) * scale
    t = torch.randn(B, W, V, generator=g, dtype=D) * scale
    labels = torch.randint(0, V, (B, W), generator=g)
    labels[0, 3:] = -100
    labels[2, 1] = -100
    return s, t, labels


def test_golden_reverse_forward_and_jsd_float64():
    s, t = _logits(P_S), _logits(P_T)
    assert reverse_kl_per_token(s, t).item() == pytest.approx(REVERSE_KL, abs=1e-14)
    assert gjsd_terms(s, t, beta=1.0).sum().item() == pytest.approx(REVERSE_KL, abs=1e-14)
    assert gjsd_terms(s, t, beta=0.0).sum().item() == pytest.approx(FORWARD_KL, abs=1e-14)
    for beta, want in JSD.items():
        assert gjsd_terms(s, t, beta=beta).sum().item() == pytest.approx(want, abs=1e-14)
    # temperature 2 halves the logits: p = softmax(log p / 2) = sqrt(p) normalised
    s2 = [math.sqrt(x) / sum(math.sqrt(y) for y in P_S) for x in P_S]
    t2 = [math.sqrt(x) / sum(math.sqrt(y) for y in P_T) for x in P_T]
    want = sum(a * math.log(a / b) for a, b in zip(s2, t2))
    assert reverse_kl_per_token(s, t, temperature=2.0).item() == pytest.approx(want, abs=1e-14)
    mask = torch.ones(1, 1)
    assert reverse_kl_loss(s, t, mask).item() == pytest.approx(REVERSE_KL, abs=1e-14)
    assert gjsd_loss(s, t, mask, beta=0.5).item() == pytest.approx(JSD[0.5], abs=1e-14)


def test_reverse_kl_is_zero_on_equal_logits_and_mask_averages_tokens():
    s, t, _ = _random(1)
    assert reverse_kl_per_token(s, s).abs().max().item() < 1e-12
    per = reverse_kl_per_token(s, t)  # (B, W)
    assert per.shape == (3, 5) and (per >= 0).all()
    mask = torch.zeros(3, 5)
    mask[0, :2] = 1
    mask[2, 4] = 1
    want = (per[0, 0] + per[0, 1] + per[2, 4]) / 3
    assert reverse_kl_loss(s, t, mask).item() == pytest.approx(want.item(), abs=1e-14)
    assert reverse_kl_loss(s, t, torch.zeros(3, 5)).item() == 0.0


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_generalized_jsd_equals_trl_transcription(beta, temperature):
    s, t, labels = _random(2)
    for lab in (labels, None):
        for reduction in ("batchmean", "sum", "mean", "none"):
            ours = generalized_jsd_loss(s, t, lab, beta=beta, temperature=temperature, reduction=reduction)
            ref = trl_generalized_jsd_loss(s, t, lab, beta=beta, temperature=temperature, reduction=reduction)
            assert ours.shape == ref.shape
            torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)
        n = torch.tensor(7)
        ours = generalized_jsd_loss(s, t, lab, beta=beta, temperature=temperature, num_items_in_batch=n)
        ref = trl_generalized_jsd_loss(s, t, lab, beta=beta, temperature=temperature, num_items_in_batch=n)
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)
    mask = (labels != -100).to(D)  # the trainer's form: token mean over the answer tokens
    ref = trl_generalized_jsd_loss(s, t, labels, beta=beta, temperature=temperature)
    ours = gjsd_loss(s, t, mask, beta=beta, temperature=temperature)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)


def test_generalized_jsd_gradients_equal_trl_transcription():
    s, t, labels = _random(3)
    for beta in (0.0, 0.4, 1.0):
        a, b = s.clone().requires_grad_(), s.clone().requires_grad_()
        generalized_jsd_loss(a, t, labels, beta=beta, temperature=0.9).backward()
        trl_generalized_jsd_loss(b, t, labels, beta=beta, temperature=0.9).backward()
        torch.testing.assert_close(a.grad, b.grad, atol=1e-10, rtol=0)


def test_generalized_jsd_equals_installed_trl():
    pytest.importorskip("trl")
    try:
        from trl.experimental.gkd import GKDTrainer
    except ImportError:
        from trl import GKDTrainer  # older TRL: the trainer was in the main package
    s, t, labels = _random(4, V=17)
    for beta in (0.0, 0.3, 0.5, 1.0):
        for lab in (labels, None):
            for reduction in ("batchmean", "sum", "mean"):
                ours = generalized_jsd_loss(s, t, lab, beta=beta, temperature=1.3, reduction=reduction)
                ref = GKDTrainer.generalized_jsd_loss(
                    s, t, lab, beta=beta, temperature=1.3, reduction=reduction
                )
                torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)


def test_all_masked_batch_is_zero_not_nan():
    s, t, labels = _random(5)
    labels[:] = -100
    assert generalized_jsd_loss(s, t, labels, beta=0.5).item() == 0.0


def test_sampled_advantage_and_its_gradient_estimate_reverse_kl():
    # one position, vocabulary of 3: the exact expectation over the sampled token of the policy-gradient
    # loss's gradient equals the gradient of KL(p_s || p_t)
    s = torch.tensor([[[0.2, -0.5, 1.0]]], dtype=D, requires_grad=True)
    t = torch.tensor([[[1.0, 0.3, -0.4]]], dtype=D)
    reverse_kl_per_token(s, t).sum().backward()
    want = s.grad.clone()
    s.grad = None
    ls, lt = torch.log_softmax(s, -1), torch.log_softmax(t, -1)
    p = ls.exp().detach()
    total = 0
    for y in range(3):
        logp_s, logp_t = ls[..., y], lt[..., y]  # (1, 1)
        adv = reverse_kl_advantages(logp_s, logp_t, torch.ones(1, 1))
        assert adv.item() == pytest.approx(-(logp_s - logp_t).item(), abs=1e-15)
        total = total + p[0, 0, y] * sampled_kl_loss(logp_s, adv, torch.ones(1, 1))
    total.backward()
    torch.testing.assert_close(s.grad, want, atol=1e-12, rtol=0)


def test_sampled_loss_value_and_masks():
    ls = torch.tensor([[-1.0, -2.0, -0.5]], dtype=D)
    lt = torch.tensor([[-1.5, -1.0, -9.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0]])
    adv = reverse_kl_advantages(ls, lt, mask)
    assert adv.tolist() == [[-0.5, 1.0, 0.0]]
    assert sampled_kl_loss(ls, adv, mask).item() == pytest.approx((0.5 - 1.0) / 2, abs=1e-15)
    assert sft_loss(ls, mask).item() == pytest.approx(1.5, abs=1e-15)


def test_bad_inputs_say_what_is_wrong():
    s, t, labels = _random(6)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        gjsd_terms(s, t, beta=1.5)
    with pytest.raises(ValueError, match="same shape"):
        reverse_kl_per_token(s, t[..., :-1])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        reverse_kl_per_token(s, t, temperature=0.0)
    with pytest.raises(ValueError, match="reduction must be one of"):
        generalized_jsd_loss(s, t, labels, reduction="avg")
    with pytest.raises(ValueError, match=r"labels must be \(B, W\)"):
        generalized_jsd_loss(s, t, labels[:, :2])
    with pytest.raises(ValueError, match=r"must all be \(B, W\)"):
        reverse_kl_advantages(labels.to(D), labels.to(D)[:, :2], labels)
