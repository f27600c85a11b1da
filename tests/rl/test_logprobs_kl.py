"""Token log-probs (vs TRL's selective_log_softmax and a naive log_softmax+gather), the causal shift
convention, KL estimators (golden values) and entropy (vs TRL's entropy_from_logits)."""

from __future__ import annotations

import math

import pytest
import torch
from trl.trainer.utils import entropy_from_logits as trl_entropy
from trl.trainer.utils import selective_log_softmax

from rl.kl import KL_KINDS, entropy_from_logits, kl_estimate
from rl.logprobs import causal_token_logprobs, sequence_logprob, token_logprobs


@pytest.fixture(autouse=True)
def _float64():
    """Golden and parity checks run in float64; the default dtype is restored for other test modules."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _logits(seed=0, b=3, t=6, v=11):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, v, generator=g) * 3, torch.randint(0, v, (b, t), generator=g)


def test_token_logprobs_equal_trl_and_naive():
    logits, ids = _logits()
    ours = token_logprobs(logits, ids)
    naive = logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(ours, naive, atol=1e-12)
    assert torch.allclose(ours, selective_log_softmax(logits, ids), atol=1e-12)
    warm = token_logprobs(logits, ids, temperature=0.7)
    assert torch.allclose(warm, selective_log_softmax(logits, ids, temperature=0.7), atol=1e-12)


def test_token_logprobs_half_precision_upcasts():
    logits, ids = _logits(1)
    out = token_logprobs(logits.to(torch.bfloat16), ids)
    assert out.dtype == torch.float32
    ref = logits.to(torch.bfloat16).double().log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(out.double(), ref, atol=1e-5)


def test_token_logprobs_gradient_matches_naive():
    logits, ids = _logits(2)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    token_logprobs(a, ids).sum().backward()
    b.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-12)


def test_causal_shift_and_mask():
    # vocab 3; logits at t predict ids at t+1; prompt = first 2 tokens, response = next 2, then pad
    ids = torch.tensor([[0, 1, 2, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 0]])
    logits = torch.zeros(1, 5, 3)
    logits[0, 1, 2] = math.log(2.0)  # p(id 2 | pos 1) = 2 / 4
    logps, m = causal_token_logprobs(logits, ids, mask)
    assert m.tolist() == [[0, 1, 1, 0]]
    assert logps[0, 1].item() == pytest.approx(math.log(0.5))
    assert logps[0, 2].item() == pytest.approx(math.log(1 / 3))
    assert logps[0, 0].item() == 0.0 and logps[0, 3].item() == 0.0  # prompt / pad zeroed
    assert sequence_logprob(logps, m).item() == pytest.approx(math.log(0.5 / 3))
    assert sequence_logprob(logps, m, reduce="mean").item() == pytest.approx(math.log(0.5 / 3) / 2)


def test_sequence_logprob_empty_mask_is_zero():
    out = sequence_logprob(torch.randn(2, 3), torch.zeros(2, 3), reduce="mean")
    assert torch.equal(out, torch.zeros(2))


def test_logprob_bad_inputs():
    logits, ids = _logits()
    with pytest.raises(ValueError, match="token ids must lie in"):
        token_logprobs(logits, ids + 100)
    with pytest.raises(ValueError, match="logits must be token_ids.shape"):
        token_logprobs(logits[:, :-1], ids)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, ids, temperature=0.0)
    with pytest.raises(ValueError, match="reduce must be"):
        sequence_logprob(torch.zeros(1, 2), torch.ones(1, 2), reduce="max")


def test_kl_estimators_golden():
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    # log r = ref - lp = [-0.5, 1.0]
    assert torch.allclose(kl_estimate(lp, ref, kind="k1"), torch.tensor([[0.5, -1.0]]))
    assert torch.allclose(kl_estimate(lp, ref, kind="k2"), torch.tensor([[0.125, 0.5]]))
    k3 = torch.tensor([[math.exp(-0.5) + 0.5 - 1, math.e - 1 - 1]])
    assert torch.allclose(kl_estimate(lp, ref, kind="k3"), k3)
    assert torch.allclose(kl_estimate(lp, ref, kind="low_var_kl"), k3)
    big = kl_estimate(torch.tensor([[-100.0]]), torch.tensor([[0.0]]), kind="low_var_kl")
    assert big.item() == 10.0  # clamped like verl
    for kind in KL_KINDS:
        assert torch.equal(kl_estimate(lp, lp, kind=kind), torch.zeros_like(lp))
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(lp, ref, kind="k4")


def test_k3_is_unbiased_for_kl():
    # Monte-Carlo check on a categorical: E_pi[k1] = E_pi[k3] = KL(pi || ref)
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    true_kl = (p * (p / q).log()).sum().item()
    y = torch.multinomial(p, 200_000, replacement=True, generator=g)
    lp, ref = p.log()[y], q.log()[y]
    assert kl_estimate(lp, ref, kind="k3").mean().item() == pytest.approx(true_kl, abs=0.01)
    assert kl_estimate(lp, ref, kind="k1").mean().item() == pytest.approx(true_kl, abs=0.01)


def test_entropy_equals_trl_and_golden():
    logits, _ = _logits(3)
    assert torch.allclose(entropy_from_logits(logits, chunk_size=4), trl_entropy(logits), atol=1e-12)
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4))
    assert entropy_from_logits(torch.tensor([0.0, -1e4])).item() == pytest.approx(0.0, abs=1e-12)
    assert entropy_from_logits(logits.to(torch.bfloat16)).dtype == torch.float32


def test_token_logprobs_one_pass_equals_row_at_a_time(monkeypatch):
    import rl.logprobs as lp

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 6, 11, dtype=torch.float64, generator=g)
    ids = torch.randint(0, 11, (4, 6), generator=g)
    results = []
    for budget in (lp.ONE_PASS_ELEMENTS, 0):  # the vectorised pass, then the row loop
        monkeypatch.setattr(lp, "ONE_PASS_ELEMENTS", budget)
        x = logits.clone().requires_grad_(True)
        out = token_logprobs(x, ids, temperature=0.8)
        out.sum().backward()
        results.append((out.detach(), x.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=1e-12)
