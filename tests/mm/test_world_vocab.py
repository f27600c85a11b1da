"""The world vocabulary: unique surface forms, partners, visual identities."""

import pytest

from mm.world import vocab


def test_sizes_of_vocabulary():
    assert len(vocab.CATEGORIES) == 32
    assert len(vocab.COLORS) == 8
    assert vocab.SIZES == ("small", "medium", "large")
    assert set(vocab.COLOR_RGB) == set(vocab.COLORS)


def test_each_category_has_unique_shape_glyph():
    ids = [(c.shape, c.glyph) for c in vocab.CATEGORIES]
    assert len(set(ids)) == len(ids)


def test_partners_symmetric_and_visually_distinct():
    for a, b in vocab.PARTNER_PAIRS:
        assert b in vocab.partners(a) and a in vocab.partners(b)
        ca, cb = vocab.category(a), vocab.category(b)
        assert ca.shape != cb.shape  # a partner never looks like its anchor
        assert ca.theme == cb.theme
    assert vocab.partners("fork") == ("knife",)
    assert vocab.partners("plate") == ()


def test_synonym_table_forms_are_unique_and_invertible():
    table = vocab.synonym_table()
    assert set(table) == set(vocab.CATEGORY_NAMES)
    inv = vocab.surface_to_category()
    assert sum(len(v) for v in table.values()) == len(inv)
    assert inv["knives"] == "knife" and inv["mice"] == "mouse" and inv["puppies"] == "dog"
    assert inv["computer mouse"] == "mouse" and inv["bars of soap"] == "soap"
    assert "table knife" in table["knife"]


def test_unknown_category_message_lists_known():
    with pytest.raises(KeyError, match="known categories: fork"):
        vocab.partners("spoon")
