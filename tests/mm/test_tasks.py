"""Task construction: samples from notes, label masks of captions and yes/no answers, CHAIR-based scores."""

from __future__ import annotations

import pytest
import torch

from mm.data.format import Note, ObjectAnnotation, Question
from mm.model.processing import IGNORE_INDEX
from mm.train.tasks import (
    CAPTION_PROMPT,
    Sample,
    attribute_question_samples,
    build_samples,
    count_kinds,
    pope_question_samples,
    yes_no_answer,
)


def _note(i=0, text="A photo from a kitchen. It shows a red fork.", convs=None):
    return Note(
        id=f"n{i}",
        images=["a.png", "b.png"],
        text=text,
        objects=[[ObjectAnnotation("fork", (0, 0, 4, 4), "red")], []],
        questions=[
            Question(f"n{i}_q0", "Is there a fork in image 1?", "yes", 0, "fork"),
            Question(f"n{i}_q1", "Is there a knife in this note?", "no", None, "knife"),
        ],
        conversations=convs,
    )


def test_yes_no_answer_styles():
    assert yes_no_answer("yes", "fork") == "yes" and yes_no_answer("no", "fork", "word") == "no"
    assert yes_no_answer("yes", "fork", "object") == "A fork: yes"
    assert yes_no_answer("no", "umbrella", "object") == "An umbrella: no"
    assert yes_no_answer("no", None, "object") == "no"  # no object to name: the word
    with pytest.raises(ValueError, match="answer style"):
        yes_no_answer("yes", "fork", "sentence")
    with pytest.raises(ValueError, match="'yes' or 'no'"):
        yes_no_answer("Yes", "fork", "object")
    # every parser the evaluation and the rewards use reads both styles
    from mm.eval.pope import parse_original, parse_vlmevalkit

    for label in ("yes", "no"):
        for obj in ("fork", "notebook", "umbrella"):
            text = yes_no_answer(label, obj, "object")
            assert parse_original(text) == parse_vlmevalkit(text) == label, text


def test_build_samples_object_first_answers():
    s = build_samples([_note(0)], kinds=("question",), answer_style="object")
    assert [x.answer for x in s] == ["A fork: yes", "A knife: no"]
    assert [x.prompt for x in s] == ["Is there a fork in image 1?", "Is there a knife in this note?"]


def test_build_samples_kinds_and_order():
    convs = [
        {"from": "human", "value": "<image>\nWhat is on the table?"},
        {"from": "gpt", "value": "A red fork."},
        {"from": "human", "value": "Any knife?"},
        {"from": "gpt", "value": "No."},
    ]
    notes = [_note(0), _note(1, text="  ", convs=convs)]
    s = build_samples(notes, kinds=("caption", "question", "conversation"))
    assert s[0] == Sample(note=0, kind="caption", prompt=CAPTION_PROMPT, answer=notes[0].text)
    assert [x.answer for x in s[1:3]] == ["yes", "no"]
    assert s[1].prompt == "Is there a fork in image 1?"
    # note 1 has blank text: no caption sample; its chat turns are single-turn samples without <image>
    kinds = {"caption": 1, "image_caption": 0, "question": 4, "pope_question": 0, "conversation": 2}
    kinds["attribute_question"] = kinds["colour_answer"] = kinds["count_answer"] = 0
    assert count_kinds(s) == kinds
    chat = [x for x in s if x.kind == "conversation"]
    assert chat[0].prompt == "What is on the table?" and chat[0].answer == "A red fork."
    assert build_samples(notes, kinds=("question",), questions_per_note=1)[1].note == 1


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="attribute_question, colour_answer, count_answer, conversation"):
        build_samples([_note()], kinds=("captions",))


def test_image_caption_samples_show_one_image_each():
    from mm.train.sft_data import SampleSet, to_unit
    from mm.train.tasks import IMAGE_CAPTION_PROMPT

    note = _note()
    note.image_captions = ["A red fork.", "  "]  # the blank second caption makes no sample
    samples = build_samples([note], kinds=("caption", "image_caption"))
    assert [(x.kind, x.image) for x in samples] == [("caption", None), ("image_caption", 0)]
    assert samples[1] == Sample(
        note=0, kind="image_caption", prompt=IMAGE_CAPTION_PROMPT, answer="A red fork.", image=0
    )
    proc = _processor()
    images = [torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)]
    ss = SampleSet(processor=proc, images=images, samples=samples)
    ref = proc.encode(to_unit(images[0][:1]), IMAGE_CAPTION_PROMPT, "A red fork.")
    assert torch.equal(ss.input_ids[1], ref["input_ids"]) and torch.equal(ss.labels[1], ref["labels"])
    assert int((ss.input_ids[1] == proc.image_token_id).sum()) == 3  # one image of 3 tokens
    batch = ss.batch([1])
    assert batch["pixel_values"].shape[1] == 1 and torch.allclose(
        batch["pixel_values"][0, 0], ref["pixel_values"][0], atol=1e-6
    )
    from mm.errors import UserError

    with pytest.raises(UserError, match="shows image 5, but the note has 2 images"):
        SampleSet(processor=proc, images=images, samples=[Sample(0, "image_caption", "p", "a", image=5)])


def _processor(max_length=200):
    from mm.data.tokenizer import load_tokenizer
    from mm.model import NoteProcessor

    return NoteProcessor(tokenizer=load_tokenizer(), image_size=8, tokens_per_image=3, max_length=max_length)


@pytest.mark.parametrize("kind", ["caption", "question"])
def test_labels_are_the_answer_and_eos_only(kind):
    from mm.train.sft_data import SampleSet, to_unit

    proc = _processor()
    notes = [_note()]
    images = [torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)]
    samples = build_samples(notes, kinds=(kind,))
    ss = SampleSet(processor=proc, images=images, samples=samples)
    for i, s in enumerate(samples):
        ids, labels = ss.input_ids[i], ss.labels[i]
        learned = labels[labels != IGNORE_INDEX]
        answer = proc.tokenizer(s.answer, add_special_tokens=False)["input_ids"]
        assert learned.tolist() == [*answer, proc.tokenizer.eos_token_id]
        assert proc.tokenizer.decode(learned[:-1]) == s.answer
        # everything before the answer is masked: images, separators, chat roles and the prompt
        n_masked = int((labels == IGNORE_INDEX).sum())
        assert (labels[:n_masked] == IGNORE_INDEX).all() and (
            ids[:n_masked] == proc.image_token_id
        ).sum() == 6
        # same tokens and labels as the processor itself
        ref = proc.encode(to_unit(images[0]), s.prompt, s.answer)
        assert torch.equal(ref["input_ids"], ids) and torch.equal(ref["labels"], labels)
    batch = ss.batch(range(len(samples)))
    ref = proc.collate([proc.encode(to_unit(images[0]), s.prompt, s.answer) for s in samples])
    for k in ("input_ids", "attention_mask", "labels", "image_mask"):
        assert torch.equal(batch[k], ref[k]), k
    assert torch.allclose(batch["pixel_values"], ref["pixel_values"], atol=1e-6)


def test_long_answer_is_truncated_by_the_processor_rules():
    from mm.train.sft_data import SampleSet

    proc = _processor(max_length=30)
    images = [torch.zeros(2, 3, 8, 8, dtype=torch.uint8)]
    long = _note(text=" ".join(["a red fork and a blue cup."] * 10))
    ss = SampleSet(processor=proc, images=images, samples=build_samples([long], kinds=("caption",)))
    assert len(ss.input_ids[0]) == 30 and (ss.labels[0] != IGNORE_INDEX).sum() > 0


def test_sample_whose_images_do_not_fit_is_rejected():
    from mm.errors import UserError
    from mm.train.sft_data import SampleSet

    proc = _processor(max_length=8)
    with pytest.raises(UserError, match="truncation would cut image tokens"):
        SampleSet(
            processor=proc,
            images=[torch.zeros(2, 3, 8, 8, dtype=torch.uint8)],
            samples=build_samples([_note()], kinds=("caption",)),
        )


def test_caption_metrics_golden():
    from mm.train.caption_eval import caption_object_metrics, hallucination_cause

    # present: fork, cup; knife is a co-occurrence partner of fork
    assert hallucination_cause("knife", {"fork", "cup"}) == "partner"
    caps = ["A red fork, a knife and a mug.", "A cup."]
    objs = [{"fork", "cup"}, {"cup", "plate"}]
    m = caption_object_metrics(caps, objs)
    # mentions: fork, knife, cup(mug) | cup -> 4 mentions, 1 hallucinated (knife)
    assert m["n_mentions"] == 4 and m["n_hallucinated"] == 1
    assert m["chair_i"] == pytest.approx(0.25) and m["precision"] == pytest.approx(0.75)
    assert m["chair_s"] == pytest.approx(0.5)
    assert m["recall"] == pytest.approx(3 / 4)  # fork, cup of 2 + cup of 2
    assert m["halluc_partner"] == 1 and m["halluc_partner_frac"] == 1.0
    assert m["mean_length"] == pytest.approx((8 + 2) / 2)


def test_pope_question_samples_ask_about_one_image_with_in_theme_negatives():
    from mm.world import vocab
    from mm.world.config import WorldConfig
    from mm.world.generate import generate_notes

    notes = generate_notes(WorldConfig(notes=80, image_size=64))
    per = pope_question_samples(notes, per_note=2, answer_style="object")
    assert len(per) == len(notes)
    samples = [s for group in per for s in group]
    assert all(len(group) == 2 for group in per)

    def in_theme(s):  # is the asked object of the theme of the image's objects?
        themes = {vocab.category(a.category).theme for a in notes[s.note].objects[s.image]}
        return vocab.category(s.prompt.split()[3]).theme in themes

    labels = []
    for s in samples:
        note = notes[s.note]
        assert s.kind == "pope_question" and 0 <= s.image < len(note.images)
        present = {a.category for a in note.objects[s.image]}
        obj, label = s.answer.split(" ", 1)[1].split(": ")
        assert s.prompt == f"Is there {'an' if obj[0] in 'aeiou' else 'a'} {obj} in this note?"
        assert (label == "yes") == (obj in present)  # the truth about THAT image
        labels.append(label)
    assert 0.35 < labels.count("yes") / len(labels) < 0.65
    # adversarial "no" objects co-occur with the image's objects: mostly absent objects of its own theme
    adv = [in_theme(s) for s in samples if s.answer.endswith("no")]
    groups = pope_question_samples(notes, per_note=2, split="random")
    rand = [in_theme(s) for g in groups for s in g if s.answer == "no"]
    assert sum(adv) / len(adv) > max(0.6, 2 * sum(rand) / len(rand))
    again = build_samples(notes, kinds=("pope_question",), answer_style="object", pope_questions_per_note=2)
    assert again == samples  # deterministic for a seed
    assert build_samples(notes, kinds=("pope_question",), pope_questions_per_note=2, seed=1) != again


def test_attribute_question_samples_ask_one_image_about_a_colour():
    from mm.world.config import WorldConfig
    from mm.world.generate import generate_notes

    notes = generate_notes(WorldConfig(notes=60, image_size=64))
    per = attribute_question_samples(notes, per_note=2, answer_style="object")
    assert len(per) == len(notes) and all(len(g) == 2 for g in per)
    labels, binding = [], []
    for s in (s for g in per for s in g):
        objs = notes[s.note].objects[s.image]
        assert s.kind == "attribute_question" and 0 <= s.image < len(notes[s.note].images)
        coloured, label = s.answer.split(" ", 1)[1].split(": ")
        colour, obj = coloured.split(" ", 1)
        assert s.prompt == f"Is there {'an' if colour[0] in 'aeiou' else 'a'} {colour} {obj} in this note?"
        own = {o.color for o in objs if o.category == obj}
        assert own and (label == "yes") == (colour in own)  # about an object of THAT image, judged there
        if label == "no":  # adversarial: another object of the image has the asked colour, when one can
            others = {o.color for o in objs if o.category != obj} - own
            binding.append(colour in others if others else True)
        labels.append(label)
    assert 0.35 < labels.count("yes") / len(labels) < 0.65 and all(binding)
    again = build_samples(
        notes, kinds=("attribute_question",), answer_style="object", attribute_questions_per_note=2
    )
    assert again == [s for g in per for s in g]  # deterministic for a seed
    assert (
        build_samples(notes, kinds=("attribute_question",), attribute_questions_per_note=2, seed=1) != again
    )


def test_colour_answer_samples_ask_the_one_colour_of_a_category_in_one_image():
    from mm.train.tasks import colour_answer_samples
    from mm.world.config import WorldConfig
    from mm.world.generate import generate_notes

    notes = generate_notes(WorldConfig(notes=60, image_size=64))
    per = colour_answer_samples(notes, per_note=2, seed=0)
    assert len(per) == len(notes) and all(len(g) <= 2 for g in per) and sum(map(len, per)) > 100
    for s in (s for g in per for s in g):
        objs = notes[s.note].objects[s.image]
        obj = s.prompt.removeprefix("What colour is the ").removesuffix(" in this photo?")
        assert s.kind == "colour_answer" and {o.color for o in objs if o.category == obj} == {s.answer}
    # a category shown in two colours has no one answer: never asked
    two = [
        (i, k, c)
        for i, n in enumerate(notes)
        for k, objs in enumerate(n.objects)
        for c in {o.category for o in objs}
        if len({o.color for o in objs if o.category == c}) > 1
    ]
    assert two
    asked = {(s.note, s.image, s.prompt) for g in colour_answer_samples(notes, per_note=99) for s in g}
    assert not any((i, k, f"What colour is the {c} in this photo?") in asked for i, k, c in two)
    again = build_samples(notes, kinds=("colour_answer",), colour_answers_per_note=2)
    assert again == [s for g in per for s in g]  # deterministic for a seed


def test_count_answer_samples_count_a_category_in_one_image_and_balance_the_counts():
    from collections import Counter

    from mm.train.tasks import count_answer_samples
    from mm.world.config import WorldConfig
    from mm.world.generate import generate_notes
    from mm.world.vocab import category

    notes = generate_notes(WorldConfig(notes=80, image_size=64))
    per = count_answer_samples(notes, per_note=3, seed=0)
    assert len(per) == len(notes) and all(len(g) <= 3 for g in per)
    asked = [s for g in per for s in g]
    plurals = {category(o.category).plural: o.category for n in notes for objs in n.objects for o in objs}
    for s in asked:
        what = s.prompt.removeprefix("How many ").removesuffix(" are in this photo?")
        objs = notes[s.note].objects[s.image]
        assert s.kind == "count_answer" and s.answer == str(sum(o.category == plurals[what] for o in objs))
    assert len({(s.note, s.image, s.prompt) for s in asked}) == len(asked)  # drawn without replacement
    # a count value is drawn before a category: "1" (most categories) is less common than among all
    every = Counter(s.answer for g in count_answer_samples(notes, per_note=99) for s in g)
    drawn = Counter(s.answer for s in asked)
    assert len(every) > 1 and drawn["1"] / len(asked) < every["1"] / sum(every.values())
    again = build_samples(notes, kinds=("count_answer",), count_answers_per_note=3)
    assert again == asked  # deterministic for a seed
    assert count_answer_samples(notes, per_note=3, seed=1) != per


def test_plural_falls_back_for_names_outside_the_world():
    from mm.train.tasks import plural

    assert plural("bus") == "buses" and plural("zebra") == "zebras"
