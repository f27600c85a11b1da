"""NoteVLM visibility modes in the LM: the 4D mask it builds, a manual attention computation, cached vs
uncached generation, and that "own" really hides other photos (exact logits under perturbation)."""

from __future__ import annotations

import math

import pytest
import torch

from mm.multi_image import layout_ids
from tests.helpers.model import K, random_images, tiny_model, tiny_processor

IMG, START, END, BOS = 4, 5, 6, 1
WORDS = [7, 8, 9, 10, 11, 12, 13, 14]


def _interleaved(n_images: int = 3, words: int = 2) -> torch.Tensor:
    """[bos] then per photo: <im_start> <image> x K <im_end> w w ...; then a shared question: (1, T)."""
    ids = [BOS]
    for i in range(n_images):
        ids += [START, *([IMG] * K), END, *WORDS[2 * i : 2 * i + words]]
    return torch.tensor([ids + [13, 14, 7]])


def _pixels(n: int, seed: int = 0) -> torch.Tensor:
    return torch.stack(random_images(n, seed=seed))[None]  # (1, n, 3, S, S)


def test_layout_ids_golden():
    ids = torch.tensor([[BOS, START, IMG, IMG, END, 7, START, IMG, IMG, END, 8, 9]])
    image_ids, segment_ids = layout_ids(ids, image_token_id=IMG, tokens_per_image=2)
    assert image_ids.tolist() == [[-1, -1, 0, 0, -1, -1, -1, 1, 1, -1, -1, -1]]
    # text between photo 0 and photo 1 is segment 0; before the first / after the last photo: shared
    assert segment_ids.tolist() == [[-1, -1, -1, -1, 0, 0, 0, -1, -1, -1, -1, -1]]


def test_default_visibility_is_all_and_config_round_trips(tmp_path):
    from mm.model import NoteVLMForConditionalGeneration

    assert tiny_model().config.visibility == "all"
    model = tiny_model(visibility="own", image_index_embeddings=True)
    multi = model.config.multi_image
    assert (multi.visibility, multi.max_images, multi.index_embeddings) == ("own", 4, True)
    model.save_pretrained(tmp_path)
    back = NoteVLMForConditionalGeneration.from_pretrained(str(tmp_path))
    assert back.config.visibility == "own" and back.config.multi_image == multi
    with pytest.raises(ValueError, match="visibility"):
        tiny_model(visibility="mine")


@pytest.mark.parametrize("mode", ["all", "own"])
def test_eager_attention_equals_manual_masked_softmax(mode):
    """Layer-0 attention probabilities of the LM = softmax(q k^T / sqrt(d) + mask), computed by hand."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    model = tiny_model(visibility=mode)
    model.language_model.config._attn_implementation = "eager"
    ids, px = _interleaved(), _pixels(3)
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=px, output_attentions=True)
        tokens, mask = model.model.get_image_features(px)
        emb = model.model.merge_image_tokens(ids, model.get_input_embeddings()(ids), tokens, mask)
        lm = model.language_model
        layer = lm.layers[0]
        h = layer.input_layernorm(emb)  # (1, T, D)
        T, heads = ids.shape[1], lm.config.num_attention_heads
        d = lm.config.hidden_size // heads
        q = layer.self_attn.q_proj(h).view(1, T, heads, d).transpose(1, 2)  # (1, H, T, d)
        k = layer.self_attn.k_proj(h).view(1, T, -1, d).transpose(1, 2)  # (1, H_kv, T, d)
        cos, sin = lm.rotary_emb(h, torch.arange(T)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = k.repeat_interleave(heads // k.shape[1], dim=1)  # (1, H, T, d)
        image_ids, segment_ids = layout_ids(ids, image_token_id=IMG, tokens_per_image=K)
        g = torch.where(image_ids >= 0, image_ids, segment_ids)[0]  # (T,) -1 = shared
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        if mode == "own":
            allowed &= (g[:, None] < 0) | (g[None, :] < 0) | (g[:, None] == g[None, :])
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)  # (1, H, T, T)
        manual = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    torch.testing.assert_close(out.attentions[0], manual, rtol=1e-5, atol=1e-6)
    assert torch.all(out.attentions[0][..., ~allowed] == 0)
    if mode == "own":  # the layout really has hidden pairs: photo 1 tokens never see photo 0
        assert not allowed[image_ids[0] == 1][:, image_ids[0] == 0].any()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_own_hides_other_photos_exactly(attn):
    """Interleaved note: perturbing photo 0 leaves photo 1's segment exactly unchanged under "own"."""
    ids, px = _interleaved(), _pixels(3)
    seg1 = (layout_ids(ids, image_token_id=IMG, tokens_per_image=K)[1][0] == 1).nonzero().flatten()
    px2 = px.clone()
    px2[0, 0] = torch.rand_like(px2[0, 0])
    for mode in ("own", "all"):
        model = tiny_model(visibility=mode)
        model.language_model.config._attn_implementation = attn
        with torch.no_grad():
            a = model(input_ids=ids, pixel_values=px).logits[0, seg1]
            b = model(input_ids=ids, pixel_values=px2).logits[0, seg1]
        if mode == "own":
            assert torch.equal(a, b)
        else:
            assert not torch.allclose(a, b)


def test_own_with_explicit_segments_hides_a_later_photo():
    """Photos 0-2 first, then segment 0, 1 text: perturbing photo 2 leaves segment 1 exactly unchanged."""
    proc = tiny_processor()
    batch = proc([random_images(3)], ["describe the note is there a cat"], ["a red cat"])
    ids = batch["input_ids"]
    image_ids, segment_ids = layout_ids(ids, image_token_id=IMG, tokens_per_image=K)
    last = int((image_ids[0] == 2).nonzero().max())
    segment_ids[0, last + 1] = 2  # <im_end> of photo 2 belongs to photo 2's branch
    segment_ids[0, last + 2 : last + 5] = 0
    segment_ids[0, last + 5 : last + 8] = 1
    seg1 = torch.arange(last + 5, last + 8)
    px2 = batch["pixel_values"].clone()
    px2[0, 2] = torch.rand_like(px2[0, 2])
    model = tiny_model(visibility="own")
    with torch.no_grad():
        a = model(**batch, segment_ids=segment_ids).logits
        b = model(**{**batch, "pixel_values": px2}, segment_ids=segment_ids).logits
    assert torch.equal(a[0, seg1], b[0, seg1])
    assert not torch.allclose(a[0, -1], b[0, -1])  # shared text after everything still sees photo 2


@pytest.mark.parametrize("mode", ["all", "own"])
def test_cached_generation_equals_uncached(mode):
    model = tiny_model(seed=2, visibility=mode)
    proc = tiny_processor()
    notes = [random_images(3), random_images(1, seed=1)]
    inputs = proc(notes, ["describe the note", "is there a cat"], padding_side="left")
    kw = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = model.generate(**inputs, use_cache=True, **kw)
        plain = model.generate(**inputs, use_cache=False, **kw)
    assert torch.equal(cached.sequences, plain.sequences)
    for a, b in zip(cached.scores, plain.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_own_changes_the_prompt_layout_result_and_errors():
    ids, px = _interleaved(), _pixels(3)
    with torch.no_grad():
        own = tiny_model(visibility="own")(input_ids=ids, pixel_values=px).logits
        everything = tiny_model(visibility="all")(input_ids=ids, pixel_values=px).logits
    assert torch.equal(own[0, :2], everything[0, :2])  # before the first photo nothing differs
    assert not torch.allclose(own, everything)
    with pytest.raises(ValueError, match="segment_ids only apply"):
        tiny_model()(input_ids=ids, pixel_values=px, segment_ids=torch.zeros_like(ids))
    with pytest.raises(ValueError, match=r"segment_ids must be \(B, T\)"):
        tiny_model(visibility="own")(input_ids=ids, pixel_values=px, segment_ids=torch.zeros(1, 3).long())
    model = tiny_model(visibility="own")
    model.language_model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation"):
        model(input_ids=ids, pixel_values=px)


def test_rl_rollout_decode_loop_equals_generate_under_own():
    """The policy path (rl's prefill + lean decode loop) gives generate's greedy tokens under "own", and a
    full-sequence forward over prompt + completion (how log-probs are scored) agrees with its steps."""
    from rl.trainers.rollout import sample_tokens

    model = tiny_model(seed=5, visibility="own")
    proc = tiny_processor()
    notes = [random_images(3), random_images(2, seed=1)]
    inputs = proc(notes, ["describe the note", "is there a cat"], padding_side="left")
    kw = dict(eos_id=2, pad_id=0)
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=2)
        out = sample_tokens(model, inputs, group_size=1, max_new_tokens=5, do_sample=False, **kw)
        assert torch.equal(out[:, : ref.shape[1]], ref)
        P = inputs["input_ids"].shape[1]
        full_mask = torch.cat([inputs["attention_mask"], torch.ones_like(ref[:, P:])], dim=1)
        position = (full_mask.cumsum(-1) - 1).clamp(min=0)  # as generate numbers left-padded rows
        logits = model(
            input_ids=ref, attention_mask=full_mask, position_ids=position,
            pixel_values=inputs["pixel_values"], image_mask=inputs["image_mask"],
        ).logits  # fmt: skip
    assert torch.equal(logits[:, P - 1 : -1].argmax(-1), ref[:, P:])


def test_training_under_own_segment_gradient_never_reaches_other_photos():
    """Backward through the 4D mask: segment 1's logits give photo 0's pixels exactly zero gradient (and
    photo 1's a nonzero one); the LM loss trains with gradient checkpointing on."""
    model = tiny_model(visibility="own").train()
    ids, px = _interleaved(), _pixels(3).requires_grad_(True)
    seg1 = (layout_ids(ids, image_token_id=IMG, tokens_per_image=K)[1][0] == 1).nonzero().flatten()
    model(input_ids=ids, pixel_values=px).logits[0, seg1].square().sum().backward()
    assert torch.all(px.grad[0, 0] == 0) and torch.all(px.grad[0, 2] == 0)
    assert px.grad[0, 1].abs().sum() > 0
    model.zero_grad()
    model.gradient_checkpointing_enable()
    labels = ids.masked_fill(ids == IMG, -100)
    loss = model(input_ids=ids, pixel_values=px.detach(), labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss) and model.fusion.fc1.weight.grad.abs().sum() > 0
