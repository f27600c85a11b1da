"""DAPO dynamic sampling (drop all-equal groups, keep sampling to fill the batch) and the overlong
soft penalty (DAPO eq. 13, hand-computed)."""

from __future__ import annotations

import pytest
import torch

from mm.errors import UserError
from rl.sampling import fill_groups, informative_groups, overlong_penalty


def test_informative_groups():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.5, 0.4]])
    assert informative_groups(r).tolist() == [False, True, False, True]
    assert informative_groups(torch.tensor([[3.0], [3.0]])).tolist() == [True, True]
    with pytest.raises(ValueError, match=r"\(G, n\)"):
        informative_groups(torch.zeros(4))


def _scripted(batches):
    """A sampling callable that returns the given (names, rewards) batches in order and counts calls."""
    it = iter(batches)
    calls = []

    def sample():
        calls.append(1)
        names, rewards = next(it)
        return names, torch.tensor(rewards)

    return sample, calls


def test_fill_groups_keeps_sampling_until_full():
    sample, calls = _scripted(
        [
            (["a", "b", "c"], [[1, 1], [0, 1], [0, 0]]),  # keeps b
            (["d", "e"], [[1, 1], [1, 1]]),  # keeps nothing
            (["f", "g", "h"], [[1, 0], [0, 1], [1, 0]]),  # keeps f, g; h is surplus
        ]
    )
    out = fill_groups(sample, target_groups=3, max_batches=5)
    assert out.groups == ["b", "f", "g"]
    assert out.rewards.tolist() == [[0, 1], [1, 0], [0, 1]]
    assert (out.num_batches, out.num_sampled, out.num_dropped) == (3, 8, 4)
    assert len(calls) == 3


def test_fill_groups_stops_with_clear_error():
    sample, calls = _scripted([(["a"], [[1.0, 1.0]])] * 3)
    with pytest.raises(UserError, match="found 0 of 2 groups.*after 3 batches"):
        fill_groups(sample, target_groups=2, max_batches=3)
    assert len(calls) == 3


def test_fill_groups_rejects_bad_sampler_output():
    sample, _ = _scripted([(["a", "b"], [[1.0, 0.0]])])
    with pytest.raises(ValueError, match="G groups and"):
        fill_groups(sample, target_groups=1)


def test_overlong_penalty_golden():
    lengths = torch.tensor([10, 12, 14, 16, 20])
    # L_max = 16, L_cache = 4 -> free up to 12, linear to -1 at 16, -1 beyond
    out = overlong_penalty(lengths, max_length=16, cache_length=4)
    assert out.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty(lengths, max_length=16, cache_length=4, factor=0.5).tolist()[2] == -0.25
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(lengths, max_length=4, cache_length=8)
