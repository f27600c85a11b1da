"""NoteVLM with a fusion of K tokens per note: one `<image>` block per note, shared under "own",
cached = uncached generation, save/load with the config, clear errors on a mismatched layout."""

from __future__ import annotations

import pytest
import torch

from mm.model import NoteProcessor
from tests.helpers.model import IMAGE_SIZE, K, random_images, tiny_model, tiny_tokenizer

IMG = 4
NOTE_FUSION = {"layers": 1, "heads": 2, "scope": "note", "budget_per": "note"}


def _model(**kw):
    return tiny_model(fusion_kind="qformer", fusion_kwargs=dict(NOTE_FUSION), **kw)


def _processor(budget_per: str = "note") -> NoteProcessor:
    return NoteProcessor(
        tokenizer=tiny_tokenizer(), image_size=IMAGE_SIZE, tokens_per_image=K, max_length=64,
        budget_per=budget_per,
    )  # fmt: skip


def _batch():
    notes = [random_images(3), random_images(1, seed=1)]
    return _processor()(notes, ["describe the note", "is there a cat"], ["a red cat", "no"])


def test_processor_writes_one_block_per_note_and_round_trips(tmp_path):
    proc = _processor()
    for n in (1, 2, 4):
        ids = proc.encode(random_images(n), "describe the note")["input_ids"]
        assert int((ids == IMG).sum()) == K  # K placeholders whatever the photo count
        assert int((ids == proc.im_start_id).sum()) == 1
    assert int((_processor("image").encode(random_images(3), "a")["input_ids"] == IMG).sum()) == 3 * K
    proc.save_pretrained(tmp_path)
    assert NoteProcessor.from_pretrained(tmp_path).budget_per == "note"
    assert "budget_per" not in _processor("image").to_dict()  # per-image processor files read as before
    with pytest.raises(ValueError, match="budget_per must be"):
        _processor("photo")


def test_forward_save_load_and_config(tmp_path):
    from mm.model import NoteVLMForConditionalGeneration

    model = _model()
    assert model.fusion.budget_per == "note" and model.config.fusion_kwargs["budget_per"] == "note"
    batch = _batch()
    with torch.no_grad():
        out = model(**batch)
        tokens, _ = model.model.get_image_features(batch["pixel_values"], batch["image_mask"])
    assert tokens.shape == (2, 1, K, model.config.text_config.hidden_size)
    assert torch.isfinite(out.loss)
    model.save_pretrained(tmp_path)
    back = NoteVLMForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
    assert back.fusion.budget_per == "note"
    with torch.no_grad():
        assert torch.equal(back(**batch).logits, out.logits)


def test_note_tokens_come_from_every_photo():
    model = _model()
    batch = _batch()
    px = batch["pixel_values"].clone()
    px[0, 2] = torch.rand_like(px[0, 2])  # photo 3 of note 0
    with torch.no_grad():
        a = model(**batch).logits
        b = model(**{**batch, "pixel_values": px}).logits
    assert not torch.allclose(a[0, -1], b[0, -1])
    assert torch.equal(a[1], b[1])  # the other note is untouched


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_own_treats_note_tokens_as_shared(attn):
    """The note block mixes every photo, so under "own" it is shared: the logits equal those under "all"."""
    batch = _batch()
    logits = {}
    for mode in ("all", "own"):
        model = _model(visibility=mode)
        model.language_model.config._attn_implementation = attn
        with torch.no_grad():
            logits[mode] = model(**batch).logits
    real = batch["attention_mask"].bool()  # padding rows differ (the 4D mask lets a pad see itself)
    torch.testing.assert_close(logits["own"][real], logits["all"][real], rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["all", "own"])
def test_cached_generation_equals_uncached(mode):
    model = _model(seed=2, visibility=mode)
    notes = [random_images(3), random_images(1, seed=1)]
    inputs = _processor()(notes, ["describe the note", "is there a cat"], padding_side="left")
    kw = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = model.generate(**inputs, use_cache=True, **kw)
        plain = model.generate(**inputs, use_cache=False, **kw)
    assert torch.equal(cached.sequences, plain.sequences)
    for a, b in zip(cached.scores, plain.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_mismatched_layout_and_index_embeddings_are_refused():
    model = _model()
    per_image = _processor("image")([random_images(3)], ["describe the note"])
    with pytest.raises(ValueError, match=r"1 note block x K=4 = 4 fusion tokens.*budget_per"):
        model(**per_image)
    with pytest.raises(ValueError, match="image_index_embeddings"):
        _model(image_index_embeddings=True)
