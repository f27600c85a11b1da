"""DPO-family losses: parity with TRL 1.16's DPOTrainer (called on a minimal stand-in) in float64,
plus hand-computed golden values for what TRL does not have (cDPO smoothing, BCO delta, mDPO)."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl.trainer.dpo_trainer import DPOTrainer

from rl.losses import DPO_LOSS_TYPES, bco_running_delta, dpo_loss, mdpo_anchor_loss, mdpo_conditional_loss


@pytest.fixture(autouse=True)
def _float64():
    """Golden and parity checks run in float64; the default dtype is restored for other test modules."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _pairs(seed: int, n_pairs: int = 5, max_len: int = 7):
    """Random pairs: per-token policy log-probs, ref sequence log-probs, completion masks (1 prompt token)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len, (2 * n_pairs,), generator=g)
    completion_mask = torch.zeros(2 * n_pairs, max_len + 1, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        completion_mask[i, 1 : 1 + n] = 1
    shift_mask = completion_mask[:, 1:]
    token_logps = -torch.rand(2 * n_pairs, max_len, generator=g, dtype=torch.float64) * 3 * shift_mask
    ref = token_logps.sum(1) + torch.randn(2 * n_pairs, generator=g, dtype=torch.float64)
    return token_logps, ref, completion_mask


def _trl_dpo(token_logps, ref, completion_mask, *, loss_types, loss_weights, beta, label_smoothing=0.0):
    """Run TRL's DPOTrainer._compute_loss with a fake model that returns the given per-token log-probs."""
    n = token_logps.shape[0] // 2
    outputs = SimpleNamespace(
        log_probs=token_logps,
        entropy=torch.zeros_like(token_logps),
        mean_logits=torch.zeros_like(token_logps),
        is_top1=torch.zeros_like(token_logps, dtype=torch.bool),
    )
    ident = lambda t: t  # noqa: E731
    fake = SimpleNamespace(
        model=SimpleNamespace(training=True),
        accelerator=SimpleNamespace(device=torch.device("cpu"), gather=ident, gather_for_metrics=ident),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=loss_types,
        loss_weights=loss_weights,
        beta=beta,
        label_smoothing=label_smoothing,
        use_weighting=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
    )
    inputs = {
        "input_ids": torch.zeros_like(completion_mask),
        "attention_mask": torch.ones_like(completion_mask),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref[:n],
        "ref_rejected_logps": ref[n:],
    }
    loss = DPOTrainer._compute_loss(fake, lambda **kw: outputs, inputs, return_outputs=False)
    return loss, fake._metrics["train"]


def _ours(token_logps, ref, completion_mask, **kw):
    n = token_logps.shape[0] // 2
    logps = token_logps.sum(1)
    lengths = completion_mask.sum(1)
    return dpo_loss(
        logps[:n], logps[n:], ref[:n], ref[n:], chosen_lengths=lengths[:n], rejected_lengths=lengths[n:], **kw
    )


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
def test_dpo_losses_equal_trl(loss_type):
    smoothing = 0.2 if loss_type == "robust" else 0.0
    for seed in range(3):
        token_logps, ref, mask = _pairs(seed)
        trl_loss, metrics = _trl_dpo(
            token_logps,
            ref,
            mask,
            loss_types=[loss_type],
            loss_weights=[1.0],
            beta=0.3,
            label_smoothing=smoothing,
        )
        loss, chosen_r, rejected_r = _ours(
            token_logps, ref, mask, loss_type=loss_type, beta=0.3, label_smoothing=smoothing
        )
        assert loss.shape == (5,)
        assert abs(loss.mean().item() - trl_loss.item()) < 1e-6
        assert abs(chosen_r.mean().item() - metrics["rewards/chosen"][0]) < 1e-9
        assert abs(rejected_r.mean().item() - metrics["rewards/rejected"][0]) < 1e-9
        # per pair: TRL on each pair alone
        for i in range(5):
            idx = torch.tensor([i, 5 + i])
            one, _ = _trl_dpo(
                token_logps[idx], ref[idx], mask[idx], loss_types=[loss_type], loss_weights=[1.0], beta=0.3,
                label_smoothing=smoothing,
            )  # fmt: skip
            assert abs(loss[i].item() - one.item()) < 1e-6


def test_sft_mix_in_equals_trl():
    token_logps, ref, mask = _pairs(7)
    trl_loss, _ = _trl_dpo(
        token_logps, ref, mask, loss_types=["sigmoid", "sft"], loss_weights=[1.0, 0.5], beta=0.1
    )
    loss, _, _ = _ours(token_logps, ref, mask, loss_type="sigmoid", beta=0.1, sft_weight=0.5)
    assert abs(loss.mean().item() - trl_loss.item()) < 1e-6


def test_ipo_is_length_normalised_golden():
    # c = -2 - (-4) = 2 over 4 tokens, r = -6 - (-3) = -3 over 2 tokens -> d' = 0.5 + 1.5 = 2
    t = torch.tensor
    loss, cr, rr = dpo_loss(
        t([-2.0]), t([-6.0]), t([-4.0]), t([-3.0]), loss_type="ipo", beta=0.5,
        chosen_lengths=t([4]), rejected_lengths=t([2]),
    )  # fmt: skip
    assert loss.item() == pytest.approx((2.0 - 1.0) ** 2, abs=1e-12)
    assert cr.item() == pytest.approx(1.0) and rr.item() == pytest.approx(-1.5)


def test_sigmoid_label_smoothing_is_cdpo_golden():
    t = torch.tensor
    loss, _, _ = dpo_loss(t([0.0]), t([0.0]), t([-1.0]), t([0.0]), beta=1.0, label_smoothing=0.1)
    # d = 1: -(0.9) log s(1) - 0.1 log s(-1)
    want = -0.9 * math.log(1 / (1 + math.exp(-1))) - 0.1 * math.log(1 / (1 + math.exp(1)))
    assert loss.item() == pytest.approx(want, abs=1e-12)


def test_bco_pair_delta_golden():
    t = torch.tensor
    loss, _, _ = dpo_loss(
        t([1.0]), t([0.0]), t([0.0]), t([1.0]), loss_type="bco_pair", beta=0.5, bco_delta=0.25
    )
    # beta c = 0.5, beta r = -0.5: -log s(0.5 - 0.25) - log s(-(-0.5 - 0.25))
    want = -math.log(1 / (1 + math.exp(-0.25))) - math.log(1 / (1 + math.exp(-0.75)))
    assert loss.item() == pytest.approx(want, abs=1e-12)


def test_mdpo_terms_golden():
    t = torch.tensor
    # real log-ratio 1.0, corrupted-image log-ratio -1.0, beta 0.5 -> -log s(1.0)
    cond = mdpo_conditional_loss(t([-3.0]), t([-4.0]), t([-6.0]), t([-5.0]), beta=0.5)
    assert cond.item() == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-12)
    anchor = mdpo_anchor_loss(t([-3.0]), t([-4.0]), beta=0.5, delta=1.0)  # -log s(0.5 - 1)
    assert anchor.item() == pytest.approx(math.log1p(math.exp(0.5)), abs=1e-12)


def test_dpo_gradient_pushes_chosen_up():
    pc = torch.tensor([-5.0], requires_grad=True)
    pr = torch.tensor([-5.0], requires_grad=True)
    loss, _, _ = dpo_loss(pc, pr, torch.tensor([-5.0]), torch.tensor([-5.0]), beta=0.1)
    loss.sum().backward()
    assert pc.grad.item() < 0 < pr.grad.item()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"loss_type": "dpo"}, "unknown DPO loss_type"),
        ({"loss_type": "ipo"}, "needs chosen_lengths"),
        ({"beta": 0.0}, "beta must be > 0"),
        ({"loss_type": "robust", "label_smoothing": 0.5}, r"label_smoothing must be in \[0, 0.5\)"),
        ({"sft_weight": 1.0}, "needs chosen_lengths"),
        ({"loss_type": "ipo", "sft_weight": 1.0, "chosen_lengths": torch.ones(2)}, "needs chosen_lengths"),
    ],
)
def test_dpo_bad_arguments(kwargs, match):
    x = torch.zeros(2)
    with pytest.raises(ValueError, match=match):
        dpo_loss(x, x, x, x, **kwargs)


def test_dpo_shape_mismatch():
    with pytest.raises(ValueError, match="four"):
        dpo_loss(torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2))


def test_bco_running_delta_is_the_mean_of_all_rewards_seen():
    seen = [
        torch.tensor([1.0, 2.0]),
        torch.tensor([-1.0]),
        torch.tensor([4.0, 0.0, 0.5]),
        torch.tensor([3.0]),
    ]
    mean, count = bco_running_delta(0.0, 0, seen[0], seen[1])
    mean, count = bco_running_delta(mean, count, seen[2], seen[3])
    assert count == 7
    assert mean == pytest.approx(torch.cat(seen).mean().item(), abs=1e-12)
    assert bco_running_delta(mean, count, torch.zeros(0), torch.zeros(0)) == (mean, count)
