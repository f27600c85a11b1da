"""Hallucination cause split: partner (co-occurrence) vs look-alike confusion vs other (goldens)."""

from __future__ import annotations

import pytest

from mm.eval.causes import CAUSES, cause_split, cause_split_from_chair, hallucination_cause, looks_alike


def test_looks_alike_by_shape_and_glyph():
    # world shapes: fork/notebook/bucket/bench are circles; fork and knife differ in outline
    assert looks_alike("fork", "notebook")
    assert not looks_alike("fork", "knife")
    assert not looks_alike("fork", "fork")
    # fork (circle) and plate (diamond) share the inner glyph 'solid'; fork and knife share nothing
    assert not looks_alike("fork", "plate")
    assert looks_alike("fork", "plate", by=("shape", "glyph"))
    assert not looks_alike("fork", "knife", by=("shape", "glyph"))
    with pytest.raises(ValueError, match="by must name"):
        looks_alike("fork", "knife", by=("colour",))


@pytest.mark.parametrize(
    ("name", "present", "cause"),
    [
        ("knife", {"fork"}, "partner"),  # language prior
        ("fork", {"knife", "cup"}, "partner"),  # partners are symmetric
        ("notebook", {"fork"}, "confusion"),  # same circle outline
        ("car", {"saucer"}, "confusion"),  # both triangle_down
        ("dog", {"fork", "cup"}, "other"),
        ("dog", set(), "other"),
        ("ball", {"dog", "keyboard"}, "partner"),  # partner wins over look-alike (ball/keyboard: plus)
    ],
)
def test_cause_goldens(name, present, cause):
    assert hallucination_cause(name, present) == cause


def test_present_object_is_not_a_hallucination():
    with pytest.raises(ValueError, match="present"):
        hallucination_cause("fork", {"fork"})


def test_cause_split_counts_and_fractions():
    out = cause_split([["knife", "knife", "notebook"], ["dog"], []], [{"fork"}, {"cup"}, {"tree"}])
    assert out == {
        "partner": 2,
        "confusion": 1,
        "other": 1,
        "total": 4,
        "partner_frac": 0.5,
        "confusion_frac": 0.25,
        "other_frac": 0.25,
    }
    empty = cause_split([[]], [{"fork"}])
    assert empty["total"] == 0 and all(empty[f"{c}_frac"] == 0.0 for c in CAUSES)
    with pytest.raises(ValueError, match="one present-object set"):
        cause_split([["dog"]], [])


def test_cause_split_from_chair_result():
    import warnings

    from mm.eval.chair import Vocabulary, chair_scores

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = chair_scores(
            {"a": "A fork, two knives and a jotter.", "b": "A mug and a dog."},
            {"a": ["fork"], "b": ["cup"]},
            Vocabulary.world(),
        )
    split = cause_split_from_chair(res)
    assert (split["partner"], split["confusion"], split["other"]) == (1, 1, 1)
