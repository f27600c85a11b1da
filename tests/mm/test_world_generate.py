"""The synthetic world: determinism, annotations, co-occurrence prior, captions, questions, CLI."""

import json
import re

import cv2
import numpy as np
import pytest

from mm.cli import main
from mm.config import ConfigError, load_config
from mm.data.format import read_notes
from mm.world import vocab
from mm.world.config import WorldConfig
from mm.world.generate import generate_note, generate_notes, write_world
from mm.world.render import render_scene, shape_mask
from mm.world.scene import SceneObject
from mm.world.stats import cooccurrence_stats


def test_note_depends_only_on_seed_and_index():
    a, ia = generate_note(WorldConfig(notes=5), 3)
    b, ib = generate_note(WorldConfig(notes=500), 3)
    assert a == b and all(np.array_equal(x, y) for x, y in zip(ia, ib))
    c, _ = generate_note(WorldConfig(seed=1), 3)
    assert c != a


def test_annotations_match_images_and_captions_mention_every_object():
    cfg = WorldConfig(notes=40, caption_prior=0.0)  # true texts (caption_prior: its own test below)
    for i in range(cfg.notes):
        note, images = generate_note(cfg, i)
        assert 1 <= len(images) <= 4 and len(note.objects) == len(images)
        for img, objs, cap in zip(images, note.objects, note.image_captions):
            assert img.shape == (64, 64, 3) and img.dtype == np.uint8
            assert {o.category for o in objs} == set(vocab.find_mentions(cap)), cap
            for o in objs:
                x0, y0, x1, y1 = o.bbox
                assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64
                assert o.color in vocab.COLORS and o.size in vocab.SIZES and 0.0 <= o.occluded <= 1.0
        assert set(vocab.find_mentions(note.text)) == note.categories


def test_occlusion_is_measured_from_masks():
    # a large square at the centre fully covers a small circle drawn before it
    under = SceneObject(category="fork", color="red", size="small", cx=32, cy=32, r=4)
    over = SceneObject(category="knife", color="blue", size="large", cx=32, cy=32, r=12)
    side = SceneObject(category="cup", color="green", size="small", cx=8, cy=8, r=5)
    img, anns = render_scene([under, over, side], theme="kitchen", size=64, clutter=0, noise_std=0, rng=None)
    assert [a.occluded for a in anns] == [1.0, 0.0, 0.0]
    assert tuple(img[32, 24]) == vocab.COLOR_RGB["blue"]  # square interior (glyph is solid)
    m = shape_mask("circle", 32.0, 32.0, 4.0, 64)
    assert m.sum() == pytest.approx(np.pi * 16, rel=0.25)


def test_default_world_has_the_cooccurrence_prior():
    notes = generate_notes(WorldConfig(notes=400))
    o = cooccurrence_stats(notes)["overall"]
    assert 0.58 <= o["p_partner_given_anchor"] <= 0.72  # the knob is 0.65
    assert o["p_partner_given_no_anchor"] < 0.1
    assert o["partner_small_with_anchor"] > 0.5
    assert o["partner_occluded_with_anchor"] < 0.1  # visible: the image can tell present from absent
    assert 0.2 < o["absent_partner_images"] < 0.45  # chances to hallucinate a partner
    told = sum(not set(vocab.find_mentions(n.text)) <= n.categories for n in notes)
    assert 0.1 * len(notes) < told < 0.3 * len(notes)  # texts that name an absent partner (caption_prior)
    hidden = cooccurrence_stats(generate_notes(WorldConfig(notes=400, partner_occluded=1.0)))["overall"]
    assert hidden["partner_occluded_with_anchor"] > 0.4
    assert hidden["partner_hidden_with_anchor"] > 0.2  # hard to see at all: named from context
    off = cooccurrence_stats(generate_notes(WorldConfig(notes=200, cooccurrence=0.0)))
    assert off["overall"]["p_partner_given_anchor"] == 0.0


def test_questions_balanced_and_correct():
    notes = generate_notes(WorldConfig(notes=60))
    answers = [q.answer for n in notes for q in n.questions]
    assert abs(answers.count("yes") - answers.count("no")) <= 0.1 * len(answers)
    partner_no = 0
    for n in notes:
        for q in n.questions:
            present = n.categories if q.image is None else {o.category for o in n.objects[q.image]}
            assert (q.object in present) == (q.answer == "yes"), q
            assert vocab.find_mentions(q.question) == [q.object]
            if q.answer == "no" and any(q.object in vocab.partners(c) for c in present):
                partner_no += 1
    # partner negatives exist only where a partner is absent; still far above the ~1/28 of random picks
    assert partner_no > 0.08 * answers.count("no")


def test_splits_follow_fractions():
    splits = [n.split for n in generate_notes(WorldConfig(notes=400, val_fraction=0.2, test_fraction=0.2))]
    assert 40 <= splits.count("val") <= 120 and 40 <= splits.count("test") <= 120


def test_config_rejects_bad_values(tmp_path):
    with pytest.raises(ValueError, match="cooccurrence must be a probability"):
        WorldConfig(cooccurrence=1.5)
    with pytest.raises(ValueError, match="images_per_note_max"):
        WorldConfig(images_per_note_max=5)
    with pytest.raises(ValueError, match="colour_position must be 'before' or 'after'"):
        WorldConfig(colour_position="inside")
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(WorldConfig, None, ["co_occurrence=0.5"])
    cfg = load_config(WorldConfig, "configs/mm/world_default.yaml")
    assert cfg == WorldConfig()  # the shipped YAML is the documented default


def test_write_world_round_trip_and_refuses_nonempty(tmp_path):
    out = tmp_path / "w"
    notes = write_world(WorldConfig(notes=12), out)
    back = read_notes(out)
    assert back == notes
    assert load_config(WorldConfig, out / "world.yaml") == WorldConfig(notes=12)  # reproducible
    assert json.loads((out / "stats.json").read_text())["images"] == sum(len(n.images) for n in notes)
    img = cv2.imread(str(out / back[0].images[0]))[:, :, ::-1]
    assert np.array_equal(img, generate_note(WorldConfig(), 0)[1][0])
    with pytest.raises(Exception, match="not empty"):
        write_world(WorldConfig(notes=3), out)
    assert len(read_notes(out)) == 12  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["w"]  # no temp folders left


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_parallel_equals_serial(tmp_path, monkeypatch, method):
    import mm.world.generate as gen

    monkeypatch.setattr(gen, "start_method", lambda: method)
    cfg = WorldConfig(notes=400, questions_per_note=2, images_per_note_max=1)
    a = write_world(cfg, tmp_path / "a", workers=1)
    b = write_world(cfg, tmp_path / "b", workers=2)
    assert a == b
    assert (tmp_path / "a/images/w000399_0.png").read_bytes() == (
        tmp_path / "b/images/w000399_0.png"
    ).read_bytes()


def test_cli_world_and_stats(tmp_path, capsys):
    out = tmp_path / "w"
    assert (
        main(
            ["data", "world", "--config", "configs/mm/world_default.yaml", "--out", str(out), "--notes", "20"]
        )
        == 0
    )
    assert len(read_notes(out)) == 20
    assert "p_partner_given_anchor=" in capsys.readouterr().out
    assert main(["data", "stats", str(out)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["images"] == sum(len(n.images) for n in read_notes(out))
    assert main(["data", "world", "--out", str(out), "--notes", "5"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["data", "world", "--out", str(tmp_path / "x"), "--set", "colour=1"]) == 2


def test_partner_is_mentioned_right_after_its_anchor():
    from mm.world.text import caption_order

    assert caption_order(["knife", "plate", "fork", "cup"]) == ["plate", "fork", "knife", "cup"]
    assert caption_order(["saucer", "plate"]) == ["saucer", "plate"]  # no anchor: drawing order
    pairs = 0
    for n in generate_notes(WorldConfig(notes=60)):
        for cap in n.image_captions:
            said = list(dict.fromkeys(vocab.find_mentions(cap)))
            for a, p in vocab.PARTNER_PAIRS:
                if a in said and p in said:
                    assert said.index(p) == said.index(a) + 1, cap
                    pairs += 1
    assert pairs > 20


@pytest.mark.parametrize("sub", ["world", "coco", "llava", "pope", "stats"])
def test_every_data_command_has_help(sub, capsys):
    with pytest.raises(SystemExit) as e:
        main(["data", sub, "--help"])
    assert e.value.code == 0
    assert len(capsys.readouterr().out) > 100


def test_cooccurrence_stats_golden():
    from mm.data.format import Note, ObjectAnnotation

    def obj(cat, size="medium", occ=0.0):
        return ObjectAnnotation(category=cat, bbox=(0, 0, 4, 4), color="red", size=size, occluded=occ)

    note = Note(
        id="n",
        images=["a", "b", "c", "d"],
        objects=[
            [obj("fork"), obj("knife", "small", 0.8)],  # anchor + hidden small partner
            [obj("fork"), obj("knife", "large", 0.0)],  # anchor + visible partner
            [obj("fork"), obj("plate")],  # anchor alone: a chance to hallucinate "knife"
            [obj("knife")],  # partner without anchor
        ],
    )
    s = cooccurrence_stats([note])
    p = s["pairs"]["fork->knife"]
    assert p["anchor_images"] == 3
    assert p["p_partner_given_anchor"] == 2 / 3
    assert p["p_partner_given_no_anchor"] == 1.0
    assert p["partner_small_with_anchor"] == 0.5
    assert p["partner_occluded_with_anchor"] == 0.5 and p["partner_hidden_with_anchor"] == 0.5
    assert p["partner_mean_occlusion_with_anchor"] == 0.4
    assert p["absent_partner_images"] == 0.25
    assert s["pairs"]["cup->saucer"]["p_partner_given_anchor"] is None
    assert s["overall"]["objects_per_image"] == 7 / 4 and s["category_frequency"]["fork"] == 0.75


@pytest.mark.parametrize("size", [32, 96])
def test_other_image_sizes_scale(size):
    cfg = WorldConfig(image_size=size, noise_std=3.0)
    note, images = generate_note(cfg, 1)
    assert images[0].shape == (size, size, 3)
    for objs in note.objects:
        for o in objs:
            assert 0 <= o.bbox[0] < o.bbox[2] <= size and 0 <= o.bbox[1] < o.bbox[3] <= size
    plain, _ = generate_note(WorldConfig(image_size=size), 1)
    assert plain == note  # noise changes pixels only, never scenes or texts


def test_captions_list_objects_in_vocabulary_order():
    from mm.world.text import CATEGORY_INDEX

    cfg = WorldConfig(notes=30)
    for i in range(cfg.notes):
        note, _ = generate_note(cfg, i)
        for cap in note.image_captions:
            found = vocab.find_mentions(cap)  # in order of appearance
            assert [CATEGORY_INDEX[c] for c in found] == sorted(CATEGORY_INDEX[c] for c in found), cap
    # every partner directly follows its anchor in the vocabulary, so the order keeps the bigram
    assert all(CATEGORY_INDEX[b] == CATEGORY_INDEX[a] + 1 for a, b in vocab.PARTNER_PAIRS)


def test_note_scope_cooccurrence_keeps_one_decision_per_note():
    cfg = WorldConfig(notes=300, cooccurrence=0.5, cooccurrence_scope="note", off_theme=0.0)
    mixed = 0
    for note in generate_notes(cfg):
        for anchor, partner in vocab.PARTNER_PAIRS:
            with_anchor = [{o.category for o in objs} for objs in note.objects]
            with_anchor = [cats for cats in with_anchor if anchor in cats]
            has = {partner in cats for cats in with_anchor}
            mixed += len(has) > 1
    assert mixed == 0
    per_image = WorldConfig(notes=300, cooccurrence=0.5, off_theme=0.0, cooccurrence_scope="image")
    mixed_img = sum(
        len(
            {
                partner in {o.category for o in objs}
                for objs in n.objects
                if anchor in {o.category for o in objs}
            }
        )
        > 1
        for n in generate_notes(per_image)
        for anchor, partner in vocab.PARTNER_PAIRS
    )
    assert mixed_img > 10  # per-image draws do mix within a note


@pytest.mark.parametrize(
    "partners",
    [dict(cooccurrence=0.0), dict(cooccurrence=1.0, partner_occluded=0.0)],
    ids=["none", "visible"],
)
def test_grid_placement_centres_objects_in_cells(partners):
    """Every (small, uncovered) object sits at its cell's centre, visible partners too."""
    cfg = WorldConfig(notes=40, placement="grid", grid_cell=16, grid_jitter=2.0, **partners)
    for i in range(cfg.notes):
        note, _ = generate_note(cfg, i)
        for objs in note.objects:
            for o in objs:
                if o.size != "small" or o.occluded > 0:
                    continue  # boxes of large objects are clipped at the border; covered ones are cut
                cx, cy = (o.bbox[0] + o.bbox[2]) / 2, (o.bbox[1] + o.bbox[3]) / 2
                for c in (cx, cy):
                    assert abs((c % 16) - 8) <= 2.0 + 1.0, (c, o)
    with pytest.raises(ValueError, match="grid_cell"):
        WorldConfig(placement="grid", grid_cell=24)
    with pytest.raises(ValueError, match="placement"):
        WorldConfig(placement="poisson")
    with pytest.raises(ValueError, match="cooccurrence_scope"):
        WorldConfig(cooccurrence_scope="world")


def test_caption_prior_names_absent_partners_in_texts_only():
    """caption_prior: texts name an absent partner in every image with its anchor, without a colour; objects
    and questions stay true; at 0 the texts name exactly the objects."""
    plain = generate_notes(WorldConfig(notes=300, caption_prior=0.0))
    assert all(set(vocab.find_mentions(n.text)) == n.categories for n in plain)  # at 0 the texts are true
    told = generate_notes(WorldConfig(notes=300, caption_prior=1.0))
    partner_of = dict(vocab.PARTNER_PAIRS)
    phantoms = 0
    for a, b in zip(plain, told):
        assert a.objects == b.objects and a.images == b.images
        truth = a.categories
        for q in b.questions:  # drawn after the texts, so other questions than in `a`, but still true
            seen = truth if q.image is None else {o.category for o in b.objects[q.image]}
            assert q.answer == ("yes" if q.object in seen else "no"), q
        absent = {partner_of[c] for c in truth if c in partner_of} - truth
        # at prior 1 every absent partner of a present anchor is named, and nothing else is added
        assert set(vocab.find_mentions(b.text)) == truth | absent, b.text
        for objs, cap in zip(b.objects, b.image_captions):
            here = {o.category for o in objs}
            want = here | ({partner_of[c] for c in here if c in partner_of} & absent)
            assert set(vocab.find_mentions(cap)) == want, cap
        for p in absent:
            phantoms += 1
            assert re.search(rf"\b(a|an) {p}\b", b.text) or any(
                re.search(rf"\b(a|an) {s}\b", b.text) for s in vocab.synonym_table().get(p, [])
            ), (p, b.text)  # "a knife": no colour or size word
    assert phantoms > 30
    half = generate_notes(WorldConfig(notes=300, caption_prior=0.5))
    changed = sum(x.text != y.text for x, y in zip(plain, half))
    full = sum(x.text != y.text for x, y in zip(plain, told))
    assert 0.3 * full < changed < 0.7 * full


def test_caption_prior_is_a_probability():
    with pytest.raises(ValueError, match="caption_prior must be a probability"):
        WorldConfig(caption_prior=1.5)


def test_colour_after_the_noun_changes_only_the_texts():
    from dataclasses import replace

    from mm.eval.claims.extract import build_extractor

    before = WorldConfig(notes=40, seed=3)
    after = replace(before, colour_position="after")
    extractor = build_extractor("world")
    for i in range(40):
        a, pixels_a = generate_note(before, i)
        b, pixels_b = generate_note(after, i)
        assert all(np.array_equal(x, y) for x, y in zip(pixels_a, pixels_b))
        assert (a.objects, a.questions, a.split) == (b.objects, b.questions, b.split)
        # the same claims, every colour word now right after its noun or its bracket's start
        claims = [
            sorted((c.kind, c.object, c.value, c.image) for c in extractor.extract(x.text)) for x in (a, b)
        ]
        assert claims[0] == claims[1]
        for colour in vocab.COLORS:
            assert not re.search(rf"\b{colour} [a-z]", b.text.replace(" and ", ", ")), b.text
    note = WorldConfig(notes=1, seed=0, colour_position="after")
    text = generate_note(note, 0)[0].text
    colours = "|".join(vocab.COLORS)
    assert re.search(rf"\b(a|an|two|three|four) [a-z ]+ \(({colours})", text)


def test_colour_prob_leaves_out_colours_and_nothing_else():
    from dataclasses import replace

    from mm.eval.claims.extract import build_extractor

    full = WorldConfig(notes=40, seed=5, colour_position="after")
    half = replace(full, colour_prob=0.5)
    none = replace(full, colour_prob=0.0)
    extractor = build_extractor("world")

    def claims(text: str, kind: str) -> list:
        return sorted((c.object, c.value, c.image) for c in extractor.extract(text) if c.kind == kind)

    kept = stated = 0
    for i in range(40):
        a, pixels_a = generate_note(full, i)
        b, pixels_b = generate_note(half, i)
        c, _ = generate_note(none, i)
        assert all(np.array_equal(x, y) for x, y in zip(pixels_a, pixels_b))
        assert (a.objects, a.questions, a.split) == (b.objects, b.questions, b.split)
        texts = [[n.text, *n.image_captions] for n in (a, b, c)]
        for x, y, z in zip(*texts):
            # the same mentions; colours only dropped, never changed; none at colour_prob 0
            assert claims(x, "exists") == claims(y, "exists") == claims(z, "exists")
            assert set(claims(y, "attribute")) <= set(claims(x, "attribute"))
            assert claims(z, "attribute") == []
            assert re.sub(r" \([a-z ,]+\)", "", x) == re.sub(r" \([a-z ,]+\)", "", y) == z
        kept += len(claims(b.text, "attribute"))
        stated += len(claims(a.text, "attribute"))
    assert 0.35 < kept / stated < 0.65
    with pytest.raises(ValueError, match="colour_prob must be in"):
        WorldConfig(colour_prob=1.5)
