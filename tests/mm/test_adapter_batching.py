"""Pure helpers of the model adapter: the prompt + answer layout, positions, log-probs, eos trimming."""

from __future__ import annotations

import pytest
import torch

from mm.model.adapter.batching import (
    append_answers,
    first_response_column,
    gather_logps,
    padded_position_ids,
    trim_at_eos,
)


def _prompts():
    return {
        "input_ids": torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]]),  # left padded with 0
        "attention_mask": torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]),
        "mm_token_type_ids": torch.tensor([[0, 0, 1, 0], [0, 1, 1, 0]]),
        "pixel_values": torch.ones(3, 2),
    }


def test_append_answers_golden_layout():
    out = append_answers(_prompts(), [[11, 12, 2], [13]], pad_token_id=0)
    assert out["input_ids"].tolist() == [[0, 0, 5, 6, 11, 12, 2], [7, 8, 9, 10, 13, 0, 0]]
    assert out["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]]
    assert out["response_mask"].tolist() == [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 0, 0]]
    assert out["mm_token_type_ids"].tolist() == [[0, 0, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0]]
    assert torch.equal(out["pixel_values"], torch.ones(3, 2))  # image inputs pass through


def test_append_answers_bad_inputs():
    with pytest.raises(ValueError, match="one answer per sample"):
        append_answers(_prompts(), [[1]], pad_token_id=0)
    with pytest.raises(ValueError, match=r"answers \[1\] have no tokens"):
        append_answers(_prompts(), [[1], []], pad_token_id=0)
    right = _prompts()
    right["attention_mask"] = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="left padded"):
        append_answers(right, [[1], [2]], pad_token_id=0)
    bad = _prompts()
    bad["token_type_ids"] = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"token_type_ids must be \(B, P\)=\(2, 4\)"):
        append_answers(bad, [[1], [2]], pad_token_id=0)


def test_positions_and_first_response_column():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    assert padded_position_ids(mask).tolist() == [[0, 0, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]
    assert first_response_column(torch.tensor([[0, 0, 0, 1], [0, 0, 1, 1]])) == 2
    with pytest.raises(ValueError, match="all 0"):
        first_response_column(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="position 0"):
        first_response_column(torch.tensor([[1, 1]]))


def test_gather_logps_golden():
    logits = torch.tensor([[[0.0, 0.0], [1.0, 3.0]]])  # (1, 2, 2)
    got = gather_logps(logits, torch.tensor([[0, 1]]))
    expected = torch.tensor([[-torch.log(torch.tensor(2.0)), -torch.log1p(torch.exp(torch.tensor(-2.0)))]])
    torch.testing.assert_close(got, expected)
    hot = gather_logps(logits, torch.tensor([[0, 1]]), temperature=2.0)
    torch.testing.assert_close(hot[0, 1], -torch.log1p(torch.exp(torch.tensor(-1.0))))
    assert gather_logps(logits.half(), torch.tensor([[0, 1]])).dtype == torch.float32
    with pytest.raises(ValueError, match="targets.shape"):
        gather_logps(logits, torch.tensor([[0]]))
    with pytest.raises(ValueError, match="temperature"):
        gather_logps(logits, torch.tensor([[0, 1]]), temperature=0.0)


def test_trim_at_eos():
    rows = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [3, 9, 1, 2]])
    assert trim_at_eos(rows, [2]) == [[5, 2], [5, 6, 7, 8], [3, 9, 1, 2]]
    assert trim_at_eos(rows, [2, 9]) == [[5, 2], [5, 6, 7, 8], [3, 9]]
