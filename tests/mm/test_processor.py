"""NoteProcessor: placeholder counts and separators per image, label masks, padding, truncation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mm.errors import UserError
from mm.model import IGNORE_INDEX, NoteProcessor
from tests.helpers.model import IMAGE_SIZE, K, random_images, tiny_processor


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_exact_placeholders_and_separators_per_image(n):
    proc = tiny_processor(max_length=128)
    s = proc.encode(random_images(n), "describe the note", "a cat")
    ids = s["input_ids"].tolist()
    assert ids.count(proc.image_token_id) == n * K
    assert ids.count(proc.im_start_id) == n
    # every <im_start> is followed by exactly K <image> and one <im_end>
    starts = [i for i, t in enumerate(ids) if t == proc.im_start_id]
    for st in starts:
        assert ids[st + 1 : st + 1 + K] == [proc.image_token_id] * K
        assert ids[st + 1 + K] == proc.im_end_id
    assert s["pixel_values"].shape == (n, 3, IMAGE_SIZE, IMAGE_SIZE)


def test_exact_token_layout_golden():
    proc = tiny_processor()
    tok = proc.tokenizer
    s = proc.encode(random_images(1), "is there a cat", "yes")
    expected = (
        ["<bos>", "user", ":", "<im_start>"]
        + ["<image>"] * K
        + ["<im_end>", "is", "there", "a", "cat", "<im_end>", "assistant", ":", "yes", "<eos>"]
    )
    assert tok.convert_ids_to_tokens(s["input_ids"].tolist()) == expected
    n_answer = 2  # "yes" + <eos>
    labels = s["labels"].tolist()
    assert labels[:-n_answer] == [IGNORE_INDEX] * (len(expected) - n_answer)
    assert labels[-n_answer:] == s["input_ids"].tolist()[-n_answer:]


def test_labels_mask_images_separators_and_prompt():
    proc = tiny_processor()
    s = proc.encode(random_images(3), "describe the note", "a red cat and a dog")
    ids, labels = s["input_ids"], s["labels"]
    learned = labels != IGNORE_INDEX
    special = torch.isin(ids, torch.tensor([proc.image_token_id, proc.im_start_id, proc.im_end_id]))
    assert not (learned & special).any()
    answer = proc.tokenizer("a red cat and a dog", add_special_tokens=False)["input_ids"]
    assert ids[learned].tolist() == answer + [proc.tokenizer.eos_token_id]
    assert "labels" not in proc.encode(random_images(1), "describe")


@pytest.mark.parametrize("side", ["right", "left"])
def test_collate_padding_sides(side):
    proc = tiny_processor()
    batch = proc(
        [random_images(1), random_images(3, seed=2)], ["describe", "describe the note"], ["a cat", "no"], side
    )
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    short = int(mask[0].sum())
    pad = proc.tokenizer.pad_token_id
    if side == "right":
        assert mask[0, :short].all() and not mask[0, short:].any()
        assert (ids[0, short:] == pad).all()
    else:
        assert mask[0, -short:].all() and not mask[0, :-short].any()
        assert (ids[0, :-short] == pad).all()
    assert (labels[mask == 0] == IGNORE_INDEX).all()
    assert batch["image_mask"].tolist() == [[True, False, False], [True, True, True]]
    assert batch["pixel_values"].shape == (2, 3, 3, IMAGE_SIZE, IMAGE_SIZE)
    assert (batch["pixel_values"][0, 1:] == 0).all()


def test_truncation_that_would_cut_image_tokens_is_rejected():
    proc = tiny_processor(max_length=2 * (K + 2))  # the two image blocks alone do not fit after the prefix
    with pytest.raises(UserError, match="truncation would cut image tokens"):
        proc.encode(random_images(2), "describe the note", "a cat")


def test_truncation_cutting_the_whole_answer_is_rejected_and_tail_cut_is_kept():
    proc = tiny_processor(max_length=16)
    prompt_len = len(proc.prompt_ids(1, "is there a cat"))
    assert prompt_len == 16  # <bos> user : + image block (K + 2) + 4 words + <im_end> assistant :
    with pytest.raises(UserError, match="whole answer"):
        proc.encode(random_images(1), "is there a cat", "yes")
    proc = tiny_processor(max_length=prompt_len + 2)
    s = proc.encode(random_images(1), "is there a cat", "a red cat")
    assert len(s["input_ids"]) == prompt_len + 2
    assert (s["labels"] != IGNORE_INDEX).sum() == 2


def test_image_inputs_of_all_kinds_agree(tmp_path):
    proc = tiny_processor()
    arr = (np.random.default_rng(0).random((IMAGE_SIZE, IMAGE_SIZE, 3)) * 255).astype(np.uint8)
    path = tmp_path / "im.png"
    Image.fromarray(arr).save(path)
    as_tensor = torch.from_numpy(arr.astype(np.float32) / 255).permute(2, 0, 1)
    outs = [proc.load_image(x) for x in (arr, Image.fromarray(arr), path, str(path), as_tensor)]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0])
    assert torch.allclose(outs[0], as_tensor * 2 - 1)  # mean 0.5, std 0.5


@pytest.mark.parametrize(
    "images, match",
    [([], "1..4 images"), (random_images(5), "1..4 images")],
)
def test_bad_image_counts(images, match):
    with pytest.raises(UserError, match=match):
        tiny_processor().encode(images, "describe")


def test_bad_inputs_name_the_problem():
    proc = tiny_processor()
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        proc.load_image(np.zeros((4, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="padding_side"):
        proc.collate([proc.encode(random_images(1), "describe")], padding_side="middle")
    with pytest.raises(ValueError, match="one entry per note"):
        proc([random_images(1)], ["a", "b"])
    with pytest.raises(ValueError, match="markers"):
        proc.encode(random_images(1), "describe <image>")


def test_tokenizer_without_image_token_is_rejected():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0, "<pad>": 1}, unk_token="<unk>")),
        unk_token="<unk>",
        pad_token="<pad>",
    )
    with pytest.raises(ValueError, match="no '<image>' token"):
        NoteProcessor(tokenizer=tok, image_size=8, tokens_per_image=2, max_length=16)


def test_save_and_load_round_trip(tmp_path):
    proc = tiny_processor(max_length=40)
    proc.save_pretrained(tmp_path)
    again = NoteProcessor.from_pretrained(tmp_path)
    assert again.to_dict() == proc.to_dict()
    a = proc.encode(random_images(2), "describe the note", "a cat")
    b = again.encode(random_images(2), "describe the note", "a cat")
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(UserError, match="not found"):
        NoteProcessor.from_pretrained(tmp_path / "missing")


def test_encode_note_and_dataset_item(tmp_path):
    from mm.data.format import Note

    proc = tiny_processor()
    rng = np.random.default_rng(1)
    arrays = [(rng.random((IMAGE_SIZE, IMAGE_SIZE, 3)) * 255).astype(np.uint8) for _ in range(2)]
    for i, a in enumerate(arrays):
        Image.fromarray(a).save(tmp_path / f"im{i}.png")
    note = Note(id="n0", images=["im0.png", "im1.png"], text="a red cat")
    s = proc.encode_note(note, "describe the note", note.text, root=tmp_path)
    ref = proc.encode(arrays, "describe the note", "a red cat")
    assert all(torch.equal(s[k], ref[k]) for k in ref)
    item = {"pixel_values": ref["pixel_values"]}
    prompt = torch.tensor(proc.prompt_ids(2, "describe the note"))
    assert torch.equal(proc.encode_item(item, "describe the note")["input_ids"], prompt)
    with pytest.raises(ValueError, match="pixel_values must be"):
        proc.encode_item({"pixel_values": torch.zeros(1, 3, 8, 8)}, "describe")
