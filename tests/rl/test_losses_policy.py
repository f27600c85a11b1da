"""Clipped policy loss, aggregation and value loss: parity with TRL 1.16's GRPOTrainer._compute_loss
(called on a minimal stand-in) in float64, and hand-computed values for verl's semantics."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl.trainer.grpo_trainer import GRPOTrainer

from rl.kl import kl_estimate
from rl.losses import AGG_MODES, aggregate_loss, policy_loss, value_loss


@pytest.fixture(autouse=True)
def _float64():
    """Golden and parity checks run in float64; the default dtype is restored for other test modules."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# our aggregation mode -> TRL loss_type with the same reduction (see rl.losses.aggregate_loss)
TRL_AGG = {
    "token-mean": "bnpo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum": "luspo",
    "seq-mean-token-sum-norm": "dr_grpo",
}


def _batch(seed: int, b: int = 6, t: int = 5, spread: float = 0.5):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, t, dtype=torch.long)
    for i, n in enumerate(torch.randint(1, t + 1, (b,), generator=g).tolist()):
        mask[i, :n] = 1
    old = -torch.rand(b, t, generator=g) * 3
    logps = old + spread * torch.randn(b, t, generator=g)
    ref = old + 0.3 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    return logps, old, ref, adv, mask


def _trl_grpo(
    logps, old, ref, adv, mask, *, loss_type, eps_low, eps_high, level="token", beta=0.0, delta=None
):
    ident = lambda t, **kw: t  # noqa: E731
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=delta, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=mask.shape[1],
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        accelerator=SimpleNamespace(reduce=ident, gather=ident, num_processes=1),
    )
    inputs = {
        "prompt_ids": torch.zeros(mask.shape[0], 2, dtype=torch.long),
        "prompt_mask": torch.ones(mask.shape[0], 2, dtype=torch.long),
        "completion_ids": torch.zeros_like(mask),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum().to(torch.float64),
    }
    loss = GRPOTrainer._compute_loss(fake, None, inputs)
    return loss, fake._metrics["train"]


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_policy_loss_equals_trl(agg, level):
    for seed in range(3):
        logps, old, ref, adv, mask = _batch(seed)
        kw = {"eps_low": 0.2, "eps_high": 0.28}
        trl_loss, metrics = _trl_grpo(logps, old, ref, adv, mask, loss_type=TRL_AGG[agg], level=level, **kw)
        loss, ours = policy_loss(logps, old, adv, mask, eps_low=0.2, eps_high=0.28, level=level, agg=agg)
        assert abs(loss.item() - trl_loss.item()) < 1e-6
        assert abs(ours["clip_frac_low"].item() - metrics["clip_ratio/low_mean"][0]) < 1e-6  # TRL: float32
        assert abs(ours["clip_frac_high"].item() - metrics["clip_ratio/high_mean"][0]) < 1e-6
    assert (
        metrics["clip_ratio/low_mean"][0] + metrics["clip_ratio/high_mean"][0] > 0
    )  # clipping was exercised


def test_dapo_token_mean_equals_trl_dapo():
    logps, old, ref, adv, mask = _batch(11)
    trl_loss, _ = _trl_grpo(logps, old, ref, adv, mask, loss_type="dapo", eps_low=0.2, eps_high=0.28)
    loss, _ = policy_loss(logps, old, adv, mask, eps_low=0.2, eps_high=0.28, agg="token-mean")
    assert abs(loss.item() - trl_loss.item()) < 1e-6


def test_dual_clip_equals_trl_two_sided_delta():
    logps, old, ref, adv, mask = _batch(3, spread=1.5)  # large ratios so the dual clip binds
    trl_loss, _ = _trl_grpo(
        logps, old, ref, adv, mask, loss_type="bnpo", eps_low=0.2, eps_high=0.2, delta=3.0
    )
    loss, m = policy_loss(logps, old, adv, mask, eps_low=0.2, dual_clip=3.0, agg="token-mean")
    assert abs(loss.item() - trl_loss.item()) < 1e-6
    assert m["clip_frac_dual"].item() > 0
    plain, _ = policy_loss(logps, old, adv, mask, eps_low=0.2, agg="token-mean")
    assert loss.item() < plain.item()  # the cap only ever lowers the loss


def test_kl_term_adds_linearly_like_trl():
    logps, old, ref, adv, mask = _batch(5)
    trl_loss, metrics = _trl_grpo(
        logps, old, ref, adv, mask, loss_type="grpo", eps_low=0.2, eps_high=0.2, beta=0.04
    )
    loss, _ = policy_loss(logps, old, adv, mask, agg="seq-mean-token-mean")
    kl = aggregate_loss(kl_estimate(logps, ref, kind="k3"), mask, mode="seq-mean-token-mean")
    assert abs((loss + 0.04 * kl).item() - trl_loss.item()) < 1e-6
    assert abs(aggregate_loss(kl_estimate(logps, ref), mask).item() - metrics["kl"][0]) < 1e-6


def test_policy_loss_golden_and_gradient():
    # one token, A = 1, ratio e^0.5 > 1.2 -> clipped: loss = -1.2, no gradient
    lp = torch.tensor([[0.5]], requires_grad=True)
    loss, m = policy_loss(lp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), eps_low=0.2)
    assert loss.item() == pytest.approx(-1.2)
    loss.backward()
    assert lp.grad.item() == 0.0 and m["clip_frac_high"].item() == 1.0
    # A = -2, ratio e^2 = 7.39 > c = 3: dual clip caps the loss at 2 * 3
    loss, m = policy_loss(
        torch.tensor([[2.0]]), torch.zeros(1, 1), torch.tensor([-2.0]), torch.ones(1, 1), dual_clip=3.0
    )
    assert loss.item() == pytest.approx(6.0) and m["clip_frac_dual"].item() == 1.0
    # on-policy (ratio 1): loss = -mean(A), gradient of each logp = -A / n_tokens
    lp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, m = policy_loss(lp, lp.detach(), torch.tensor([1.0, -1.0]), mask, agg="token-mean")
    loss.backward()
    assert loss.item() == pytest.approx(-1 / 3)
    assert torch.allclose(lp.grad, torch.tensor([[-1 / 3, -1 / 3, 0.0], [1 / 3, 0.0, 0.0]]))
    assert m["approx_kl"].item() == 0.0


def test_aggregation_golden_and_empty_sequences():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the last sequence is empty
    assert aggregate_loss(loss, mask, mode="token-mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(loss, mask, mode="seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(loss, mask, mode="seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate_loss(loss, mask, mode="seq-mean-token-sum-norm").item() == pytest.approx(10 / 2 / 3)
    assert aggregate_loss(loss, mask, mode="seq-mean-token-sum-norm", horizon=10).item() == pytest.approx(0.5)
    for mode in AGG_MODES:
        out = aggregate_loss(loss, torch.zeros_like(mask), mode=mode)
        assert out.item() == 0.0  # empty mask: 0, never NaN
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate_loss(loss, mask, mode="mean")


def test_value_loss_golden():
    v = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[2.0, 1.0]])
    mask = torch.ones(1, 2)
    # token 0: unclipped (1-2)^2 = 1, clipped V = 0.2 -> (0.2-2)^2 = 3.24 -> max 3.24; token 1: 1
    loss, frac = value_loss(v, old, ret, mask, clip_range=0.2)
    assert loss.item() == pytest.approx(0.5 * (3.24 + 1.0) / 2)
    assert frac.item() == pytest.approx(0.5)
    loss, _ = value_loss(v, old, ret, mask, clip_range=None)
    assert loss.item() == pytest.approx(0.5 * (1 + 1) / 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"level": "seq"}, "level must be"),
        ({"eps_low": 1.0}, "eps_low"),
        ({"agg": "sum"}, "unknown loss aggregation"),
    ],
)
def test_policy_loss_bad_arguments(kwargs, match):
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=match):
        policy_loss(x, x, torch.zeros(2), torch.ones(2, 3), **kwargs)


def test_policy_loss_bad_shapes():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(x, x, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"must all be \(B, T\)"):
        policy_loss(x, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))


def test_gspo_gradient_equals_verl_stop_gradient_form():
    """verl's GSPO uses s_i,t = sg(s_i) * pi_t / sg(pi_t) per token with seq-mean-token-mean; TRL's and ours
    use one ratio per sequence. Values and gradients must agree."""
    logps, old, _, adv, mask = _batch(9, spread=0.1)
    a = logps.clone().requires_grad_(True)
    loss, _ = policy_loss(a, old, adv, mask, level="sequence", agg="seq-mean-token-mean")
    loss.backward()

    b = logps.clone().requires_grad_(True)
    m = mask.to(b.dtype)
    seq_kl = ((b - old) * m).sum(-1) / m.sum(-1)
    log_s = b - b.detach() + seq_kl.detach().unsqueeze(-1)
    s = torch.exp(log_s)
    A = adv.unsqueeze(-1)
    per_token = torch.maximum(-A * s, -A * s.clamp(0.8, 1.2))
    verl = aggregate_loss(per_token, mask, mode="seq-mean-token-mean")
    verl.backward()
    assert abs(loss.item() - verl.item()) < 1e-9
    assert torch.allclose(a.grad, b.grad, atol=1e-9)


def test_empty_mask_gives_zero_loss_and_metrics_without_nan():
    x = torch.randn(2, 3, requires_grad=True)
    for level in ("token", "sequence"):
        for agg in AGG_MODES:
            loss, m = policy_loss(x, x.detach() + 0.5, torch.ones(2), torch.zeros(2, 3), level=level, agg=agg)
            assert loss.item() == 0.0
            assert all(v.item() == 0.0 for v in m.values())
    loss, frac = value_loss(x, x.detach(), x.detach() + 1, torch.zeros(2, 3))
    assert loss.item() == 0.0 and frac.item() == 0.0
