"""The world vocabulary: unique surface forms, partners, visual identities."""

import numpy as np
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


def test_categories_differ_in_form_and_colours_are_far_apart():
    """Shape confusions stay rare: any two categories' fill/glyph patterns differ in >= 8% of the box."""
    from mm.world.render import glyph_mask, shape_mask

    r, size = 8.0, 17  # a medium object on a 64-pixel image
    patterns = {}
    for c in vocab.CATEGORIES:
        sm = shape_mask(c.shape, 8.0, 8.0, r, size)
        gm = glyph_mask(c.glyph, c.shape, 8.0, 8.0, r, size) & sm
        patterns[c.name] = sm.astype(int) + gm.astype(int)  # 0 background, 1 fill, 2 glyph
    names = list(patterns)
    worst = min((patterns[a] != patterns[b]).mean() for i, a in enumerate(names) for b in names[i + 1 :])
    assert worst >= 0.08
    from mm.world.render import GLYPH_RGB, THEME_BACKGROUND

    rgb = {k: np.array(v, float) for k, v in vocab.COLOR_RGB.items()}
    pair_min = min(np.linalg.norm(rgb[a] - rgb[b]) for a in rgb for b in rgb if a < b)
    assert pair_min >= 100  # colour confusions stay rare
    for bg in [*THEME_BACKGROUND.values(), GLYPH_RGB]:
        assert min(np.linalg.norm(v - np.array(bg, float)) for v in rgb.values()) >= 60


def test_find_mentions_longest_form_first():
    assert vocab.find_mentions("Two computer mice, a Fork; three bars of soap.") == ["mouse", "fork", "soap"]
    assert vocab.find_mentions("a forklift and a spoon") == []


def test_neighbours_in_a_theme_differ_in_glyph():
    # the glyph (solid / hole / stripe / cross) is the salient cue; a theme's categories are listed
    # consecutively, so neighbours must not share it (a tiny tower then tells them apart quickly)
    for theme in vocab.THEMES:
        cats = [vocab.category(n) for n in vocab.categories_of_theme(theme)]
        for a, b in zip(cats, cats[1:]):
            assert a.glyph != b.glyph, (a.name, b.name)
