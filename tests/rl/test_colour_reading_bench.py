"""The colour-reading benchmark's pure parts: colour hits from logits (golden), grid cells, the linear
probe on separable data, and colour-swap pairs on a tiny world (one colour word changed, to a wrong one)."""

from __future__ import annotations

import re

import pytest
import torch

from mm.data.format import read_notes
from mm.world.config import WorldConfig
from mm.world.generate import write_world
from mm.world.vocab import COLORS
from tests.helpers.bench import load_benchmark


@pytest.fixture(scope="module")
def cr():
    return load_benchmark("colour_reading")


def test_colour_hits_golden(cr):
    forms = torch.tensor([[5, 6], [7, 8]])  # colour 0 spelt 5 or 6, colour 1 spelt 7 or 8
    logits = torch.full((1, 4, 10), -9.0)
    logits[0, 0, 5], logits[0, 0, 8] = 1.0, 1.5  # predicts label[1] = 6: colour 1 wins (1.5 > 1) -> wrong
    logits[0, 1, 5], logits[0, 1, 6], logits[0, 1, 7] = 1.0, 1.0, 1.5  # label[2] = 7: colour 0 sums more
    logits[0, 2, 7] = 3.0  # label[3] = 8: colour 1 -> right
    labels = torch.tensor([[-100, 6, 7, 8]])
    assert cr.colour_hits(logits, labels, forms) == (1, 3)
    assert cr.colour_hits(logits, torch.tensor([[-100, 1, 2, 3]]), forms) == (0, 0)


def test_cell_index(cr):
    assert cr.cell_index((0, 0, 10, 10), 64, 4) == 0
    assert cr.cell_index((50, 20, 60, 30), 64, 4) == 7  # centre (55, 25): row 1, column 3
    assert cr.cell_index((60, 60, 64, 64), 64, 4) == 15


def test_linear_probe_reads_separable_classes(cr):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(200) % 4
    x = torch.nn.functional.one_hot(y, 4).float() * 3 + 0.1 * torch.randn(200, 4, generator=g)
    assert cr.linear_probe(x, y, classes=4, steps=200) == 1.0


def test_swap_pairs_change_one_colour_to_a_wrong_one(cr, tmp_path):
    write_world(WorldConfig(notes=30, seed=1, questions_per_note=2), tmp_path / "w")
    notes = read_notes(tmp_path / "w", "train")
    pairs = cr.swap_pairs(notes, per_note=2, seed=0)
    assert pairs and len({p.id for p in pairs}) == len(pairs)
    by_id = {n.id: n for n in notes}
    colour = re.compile(r"\b(" + "|".join(COLORS) + r")\b")
    for p in pairs:
        a, b = colour.split(p.chosen), colour.split(p.rejected)
        diff = [(x, y) for x, y in zip(a, b) if x != y]
        assert len(a) == len(b) and len(diff) == 1 and diff[0] == (p.meta["from"], p.meta["to"])
        note = by_id[p.note_id]
        assert p.chosen == note.text and p.kind == "injection"
        photo = note.objects[p.meta["image"]]
        assert p.meta["to"] not in {o.color for o in photo if o.category == p.meta["object"]}
        if p.meta["binding"]:  # another object of the same photo has the new colour
            assert p.meta["to"] in {o.color for o in photo if o.category != p.meta["object"]}
    assert any(p.meta["binding"] for p in pairs)


def test_selective_rates_golden(cr):
    conf = [0.9, 0.2, 0.8, 0.6, 0.1, 0.7, 0.95, 0.3, 0.5, 0.4]
    wrong = [False, True, False, True, True, False, False, True, False, True]
    r = cr.selective_rates(conf, wrong)
    assert r["claims"] == 10 and r["rate"] == 0.5
    # most confident first: 0.95 F, 0.9 F, 0.8 F, 0.7 F, 0.6 T, 0.5 F, 0.4 T, 0.3 T, 0.2 T, 0.1 T
    assert r["rate, top 25%"] == 0.0  # 2 kept
    assert r["rate, top 50%"] == 0.2  # 5 kept, one wrong
    assert r["rate, top 60%"] == pytest.approx(1 / 6)
    assert r["rate, top 90%"] == pytest.approx(4 / 9)
    assert (r["kept, p >= 0.5"], r["rate, p >= 0.5"]) == (0.6, pytest.approx(1 / 6))
    assert (r["kept, p >= 0.9"], r["rate, p >= 0.9"]) == (0.2, 0.0)
    empty = cr.selective_rates([], [])
    assert empty["claims"] == 0 and empty["rate"] != empty["rate"]  # NaN: nothing judged
    with pytest.raises(ValueError, match="one confidence per claim"):
        cr.selective_rates([0.5], [True, False])


def test_ranking_auc_golden(cr):
    conf = [0.9, 0.2, 0.8, 0.6, 0.1, 0.7, 0.95, 0.3, 0.5, 0.4]
    wrong = [False, True, False, True, True, False, False, True, False, True]
    # right 0.9 0.8 0.7 0.95 beat all five wrong; right 0.5 beats 0.2 0.1 0.3 0.4, not 0.6: 24 of 25
    assert cr.ranking_auc(conf, wrong) == pytest.approx(0.96)
    assert cr.ranking_auc([-1.0, 2.0], [False, True]) == 0.0  # a score that ranks errors first
    assert cr.ranking_auc([1.0, 1.0, 3.0], [False, True, True]) == 0.25  # a tie counts half
    assert cr.ranking_auc([1.0], [False]) != cr.ranking_auc([1.0], [False])  # NaN: no wrong claim


@pytest.mark.parametrize("contrast", [False, True])
def test_colour_confidence_runs_on_a_saved_model(cr, tmp_path, contrast):
    from tests.helpers.eval_model import make_data_dir, make_model_dir

    r = cr.colour_confidence(
        str(make_model_dir(tmp_path)), str(make_data_dir(tmp_path)), n=2, contrast=contrast
    )
    assert r["claims"] == 0  # a random tiny model writes no colour claim; the path ran end to end
    assert r["auc"] != r["auc"]  # NaN: nothing to rank
    assert any("p >=" in k for k in r) is not contrast  # a contrast is no probability


def test_paired_changes_of_true_and_colour_swapped_captions(cr, tmp_path):
    from mm.eval.chair import Vocabulary
    from mm.eval.claims.extract import build_extractor
    from mm.eval.claims.generative import generative_scores
    from mm.eval.claims.truth import note_truth

    write_world(WorldConfig(notes=30, seed=1, questions_per_note=2), tmp_path / "w")
    notes = read_notes(tmp_path / "w", "train")
    swapped = {p.note_id: p.rejected for p in cr.swap_pairs(notes, per_note=1, seed=0)}
    notes = [n for n in notes if n.id in swapped]
    extractor = build_extractor("world")
    truth = {n.id: note_truth(n, Vocabulary.world()) for n in notes}

    def claims_json(captions):
        return {"generative": generative_scores(captions, truth, extractor, n_boot=10)}

    before = claims_json([(n.id, swapped[n.id]) for n in notes])  # one wrong colour per caption
    after = claims_json([(n.id, n.text) for n in notes])  # the true captions
    cats = {n.id: sorted(n.categories) for n in notes}
    rows = cr.paired_changes(before, after, cats)
    b_attr = before["generative"]["kinds"]["attribute"]
    assert rows["attribute rate"]["before"] == pytest.approx(b_attr["rate"]) and b_attr["rate"] > 0
    assert rows["attribute rate"]["after"] == 0.0
    assert rows["attribute rate"]["change"]["value"] == pytest.approx(-1.0)  # every wrong colour gone
    assert rows["colour coverage"]["change"]["value"] > 0  # in points: the swapped colour is covered again
    for m in ("chair_i", "mean_length"):  # the same objects and words: no change, a zero-width interval
        ch = rows[m]["change"]
        assert ch["value"] == pytest.approx(0.0) and ch["low"] == pytest.approx(0.0) == ch["high"]
    assert rows["recall"]["before"] == rows["recall"]["after"]
    line = cr._paired_line("attribute rate", rows["attribute rate"])
    assert "-100.0%" in line
    with pytest.raises(ValueError, match="not in --data"):
        cr.paired_changes(before, after, {})
