"""Golden recall values for mm.eval.retrieval."""

from __future__ import annotations

import pytest
import torch

from mm.eval.retrieval import ranks, recall_at_k, retrieval_metrics


def test_golden_ranks_and_recalls():
    notes = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    texts = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])
    # sims rows (note i vs texts): [1, 1, 0], [0, .1, 1], [1, 1.1, 1]
    # note0: true 1, others >= 1: text1 -> rank 1; note1: true .1, text2 (1) -> rank 1; note2: true 1,
    # text0 (1) and text1 (1.1) -> rank 2
    assert ranks(notes, texts).tolist() == [1, 1, 2]
    assert recall_at_k(notes, texts, (1, 2, 3)) == {1: 0.0, 2: pytest.approx(2 / 3), 3: 1.0}
    # texts as queries: sims[j, i] = text j . note i; text0: [1, 0, 1] rank 1; text1: [1, .1, 1.1] rank 2
    # (1.1 >= .1 and 1 >= .1); text2: [0, 1, 1] rank 1
    assert ranks(texts, notes).tolist() == [1, 2, 1]


def test_identity_is_perfect_and_constant_is_zero():
    e = torch.eye(12)
    m = retrieval_metrics(e, e)
    assert all(v == 1.0 for v in m.values())
    assert set(m) == {f"{d}_R@{k}" for d in ("note2text", "text2note") for k in (1, 5, 10)}
    c = torch.ones(12, 3)
    m = retrieval_metrics(c, c)
    assert m["note2text_R@1"] == 0.0 and m["text2note_R@10"] == 0.0


def test_permuted_texts():
    g = torch.Generator().manual_seed(0)
    notes = torch.nn.functional.normalize(torch.randn(20, 8, generator=g), dim=-1)
    perm = torch.arange(20).roll(1)
    # text i equals note perm[i]: the true pair is never the best match
    m = retrieval_metrics(notes, notes[perm], ks=(1,))
    assert m["note2text_R@1"] == 0.0


def test_bad_shapes():
    with pytest.raises(ValueError, match="paired"):
        ranks(torch.zeros(3, 2), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="0 pairs"):
        ranks(torch.zeros(0, 2), torch.zeros(0, 2))
