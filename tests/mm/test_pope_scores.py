"""POPE parsers and scoring: hand-checked golden values per parser, joins, degenerate cases."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm.eval.pope import parse_answer, pope_scores, vqa_process_punctuation

# answer -> (original, lmms, vlmevalkit); None = unparsed. Each checked by hand from the rules.
PARSE_GOLDEN = {
    "Yes.": ("yes", None, "yes"),
    "No, there is not.": ("no", None, "no"),
    "NO": ("yes", "no", "no"),  # original only knows No / not / no
    "Not sure": ("yes", None, None),
    "": ("yes", None, None),  # original: an empty answer counts as yes
    "Nope": ("yes", None, None),
    "The image does not show a dog.": ("no", None, None),
    "Yes. There is no cat.": ("yes", None, None),  # original keeps the first sentence only
    "There is no dog, but there is a cat.": ("no", None, "no"),
    "Yes, there is a dog.": ("yes", None, "yes"),
    "No.": ("no", None, "no"),
    " Yes \n": ("yes", "yes", "yes"),
    "yes": ("yes", "yes", "yes"),
    "no": ("no", "no", "no"),
    "yes/no": ("yes", None, None),  # '/' becomes a space for vlmevalkit: both words present
    "Yes.No": ("yes", None, None),  # vlmevalkit deletes the period: 'yesno'
    "I don't know": ("yes", None, None),
    "no\nthere is none": ("yes", None, "no"),  # original splits on ' ' only: 'no\nthere' is one token
}


@pytest.mark.parametrize("answer", list(PARSE_GOLDEN))
@pytest.mark.parametrize("i,parser", list(enumerate(("original", "lmms", "vlmevalkit"))))
def test_parser_golden(answer, i, parser):
    assert parse_answer(answer, parser) == PARSE_GOLDEN[answer][i]


def test_vqa_punctuation_quirks():
    assert vqa_process_punctuation("yes, it is") == "yes it is"  # ', ' present: deleted
    assert vqa_process_punctuation("a,b") == "a b"  # no space next to it: replaced by a space
    assert vqa_process_punctuation("1,000 dogs, 2 cats") == "1000 dogs 2 cats"  # digit,digit: delete all
    assert vqa_process_punctuation("3.5 m.") == "3.5 m"
    assert vqa_process_punctuation("." * 40) == "." * 8  # re.UNICODE (32) passed as count


def test_unknown_parser_is_clear():
    with pytest.raises(ValueError, match="original, lmms, vlmevalkit"):
        parse_answer("yes", "llava")


# 10 questions: label, answer. Per-parser predictions are worked out in the comments.
FIXTURE = [
    ("yes", "Yes."),  # orig Y TP | lmms ?   | vlm Y TP
    ("no", "No, there is not."),  # orig N TN | lmms ?   | vlm N TN
    ("no", "NO"),  # orig Y FP | lmms N TN | vlm N TN
    ("yes", "Not sure"),  # orig Y TP | lmms ?   | vlm ? (FN for recall)
    ("no", ""),  # orig Y FP | lmms ?   | vlm ?
    ("yes", "yes"),  # orig Y TP | lmms Y TP | vlm Y TP
    ("yes", "The image does not show a dog."),  # orig N FN | lmms ? | vlm ? (FN for recall)
    ("no", "Yes. There is no cat."),  # orig Y FP | lmms ?   | vlm ?
    ("yes", "no"),  # orig N FN | lmms N FN | vlm N FN
    ("no", "Nope"),  # orig Y FP | lmms ?   | vlm ?
]
LABELS = {i + 1: lab for i, (lab, _) in enumerate(FIXTURE)}
ANSWERS = [(i + 1, ans) for i, (_, ans) in enumerate(FIXTURE)]

GOLDEN = {
    # TP=3 FP=4 TN=1 FN=2: acc 4/10, P 3/7, R 3/5, F1 = 2PR/(P+R) = 0.5, 7 of 10 predicted yes
    "original": dict(tp=3, fp=4, tn=1, fn=2, unparsed=0, accuracy=0.4, precision=3 / 7, recall=0.6),
    # TP=1 FP=0 TN=1 FN=1 (+7 unparsed, wrong for accuracy, not FN): acc 2/10, P 1, R 1/2, F1 2/3
    "lmms": dict(tp=1, fp=0, tn=1, fn=1, unparsed=7, accuracy=0.2, precision=1.0, recall=0.5),
    # TP=2 FP=0 TN=2 FN=1 (+5 unknown, 2 with label yes -> FN for recall): acc 4/10, P 1, R 2/5
    "vlmevalkit": dict(tp=2, fp=0, tn=2, fn=1, unparsed=5, accuracy=0.4, precision=1.0, recall=0.4),
}
GOLDEN["original"].update(f1=0.5, yes_ratio=0.7)
GOLDEN["lmms"].update(f1=2 / 3, yes_ratio=0.1)
GOLDEN["vlmevalkit"].update(f1=4 / 7, yes_ratio=0.2)


@pytest.mark.parametrize("parser", list(GOLDEN))
def test_scores_golden(parser):
    res = pope_scores(LABELS, ANSWERS, parser=parser)
    for key, want in GOLDEN[parser].items():
        assert res[key] == pytest.approx(want, abs=1e-12), key
    assert res["n_scored"] == 10 and res["parser"] == parser
    assert res["missing_ids"] == res["duplicate_ids"] == res["extra_ids"] == []


def test_join_by_id_not_line_order():
    shuffled = ANSWERS[:]
    random.Random(3).shuffle(shuffled)
    as_dict = {str(q): a for q, a in ANSWERS}
    a = pope_scores(LABELS, ANSWERS)
    assert pope_scores(LABELS, shuffled) == a
    assert pope_scores({str(k): v for k, v in LABELS.items()}, as_dict) == a  # int and str ids join


def test_missing_duplicate_extra_ids_reported():
    answers = [(1, "yes"), (1, "no"), (2, "no"), (99, "yes")]
    with pytest.warns(RuntimeWarning) as record:
        res = pope_scores(LABELS, answers)
    assert len(record) == 3
    assert res["missing_ids"] == [str(i) for i in range(3, 11)]
    assert res["duplicate_ids"] == ["1"]
    assert res["extra_ids"] == ["99"]
    assert (res["tp"], res["tn"], res["n_scored"]) == (1, 1, 2)  # first answer to q1 ('yes') is scored
    assert len(res["warnings"]) == 3


def test_degenerate_all_no_gives_zero_precision_with_warning():
    labels = {1: "yes", 2: "no"}
    with pytest.warns(RuntimeWarning, match="precision"):
        res = pope_scores(labels, {1: "No.", 2: "No."})
    assert res["precision"] == 0.0 and res["recall"] == 0.0 and res["f1"] == 0.0
    assert res["accuracy"] == 0.5 and res["yes_ratio"] == 0.0


def test_degenerate_no_answers_at_all():
    with pytest.warns(RuntimeWarning):
        res = pope_scores({1: "yes"}, [])
    assert res["accuracy"] == 0.0 and res["n_scored"] == 0 and res["missing_ids"] == ["1"]


def test_bad_label_is_clear():
    with pytest.raises(ValueError, match="'yes' or 'no'"):
        pope_scores({1: "maybe"}, {1: "yes"})


def _evaluate_py(labels: list[str], answers: list[str]) -> dict[str, float]:
    """Transcription of POPE evaluate.py's arithmetic (line-order join) for parity."""
    preds = []
    for text in answers:
        if text.find(".") != -1:
            text = text.split(".")[0]
        words = text.replace(",", "").split(" ")
        preds.append(0 if ("No" in words or "not" in words or "no" in words) else 1)
    gold = [0 if lab == "no" else 1 for lab in labels]
    tp = sum(p == 1 and g == 1 for p, g in zip(preds, gold))
    fp = sum(p == 1 and g == 0 for p, g in zip(preds, gold))
    tn = sum(p == 0 and g == 0 for p, g in zip(preds, gold))
    fn = sum(p == 0 and g == 1 for p, g in zip(preds, gold))
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return {
        "accuracy": (tp + tn) / len(preds),
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall),
        "yes_ratio": preds.count(1) / len(preds),
    }


WORDS = ["Yes", "yes", "No", "no", "not", "NO", "there", "is", "a", "dog", ".", ",", " ", "Not"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["yes", "no"]), st.lists(st.sampled_from(WORDS), max_size=6)), min_size=2
    )
)
def test_original_parity_with_evaluate_py(rows):
    labels = [lab for lab, _ in rows]
    answers = [" ".join(ws) for _, ws in rows]
    ref_preds = [parse_answer(a, "original") for a in answers]
    gold_yes = [lab == "yes" for lab in labels]
    pred_yes = [p == "yes" for p in ref_preds]
    tp = sum(g and p for g, p in zip(gold_yes, pred_yes))
    if tp == 0:  # evaluate.py divides by zero here; our defined value is tested above
        return
    ref = _evaluate_py(labels, answers)
    ours = pope_scores(dict(enumerate(labels)), list(enumerate(answers)), parser="original")
    for key, want in ref.items():
        assert ours[key] == pytest.approx(want, abs=1e-12), key


def test_ids_2_string_2_and_2_0_are_one_question():
    res = pope_scores({2: "yes", "3": "no"}, [(2.0, "yes"), ("2", "no"), (3, "no")])
    assert res["n_scored"] == 2 and res["accuracy"] == 1.0
    assert res["duplicate_ids"] == ["2"] and res["missing_ids"] == res["extra_ids"] == []


@pytest.mark.parametrize("bad", [True, False, None, 2.5])
def test_ids_that_are_not_ids_are_clear(bad):
    with pytest.raises(ValueError, match="question id must be a string or an integer"):
        pope_scores({bad: "yes"}, [])
    with pytest.raises(ValueError, match="question id must be a string or an integer"):
        pope_scores({1: "yes"}, [(bad, "yes")])
