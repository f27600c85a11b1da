"""Rollouts keep the raw sampled ids, mask exactly the generated tokens, and score them as generate did."""

from __future__ import annotations

import pytest
import torch

from rl.trainers.common import batch_token_logps, response_window  # noqa: E402
from rl.trainers.rollout import (  # noqa: E402
    _top_p_filter,
    decode_loop_supported,
    draw_inverse_cdf,
    generate_rollout,
    merge_rollouts,
    response_mask_from_ids,
    sample_tokens,
)
from tests.helpers.eval_model import make_data_dir, make_model_dir  # noqa: E402

EOS, PAD = 2, 0


def test_response_mask_golden():
    ids = torch.tensor([[5, 6, 2, 0, 0], [7, 2, 2, 9, 1], [3, 4, 5, 6, 7]])
    mask, truncated = response_mask_from_ids(ids, EOS)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert truncated.tolist() == [False, False, True]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from mm.data.format import read_notes
    from mm.eval.runners import load_model
    from mm.train.sft_data import load_note_images
    from rl.trainers.common import note_pixels

    root = tmp_path_factory.mktemp("rollout")
    model, processor = load_model(make_model_dir(root), device="cpu")
    data = make_data_dir(root, split="train")
    notes = read_notes(data)
    images = load_note_images(notes, data, processor.image_size)
    items = [
        processor.encode_pixels(note_pixels(im, processor), p)
        for im, p in zip(images, ["describe", "is there a cup"])
    ]
    return model, processor, processor.collate(items, padding_side="left")


def _roll(model, prompts, seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(group_size=3, max_new_tokens=8, eos_id=EOS, pad_id=PAD, temperature=0.7)
    args["sampler"] = "multinomial"  # the very tokens generate samples
    return generate_rollout(model, prompts, **{**args, **kw})


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_rollout_keeps_sampled_ids_masks_and_generation_logps(loaded, top_p):
    model, processor, prompts = loaded
    assert processor.tokenizer.eos_token_id == EOS and processor.tokenizer.pad_token_id == PAD
    assert decode_loop_supported(model)  # NoteVLM (suppress_tokens = [<image>]) goes through the decode loop
    roll = _roll(model, prompts, top_p=top_p)
    torch.manual_seed(0)
    gen = model.generate(
        **prompts, do_sample=True, temperature=0.7, top_p=top_p, top_k=0, num_return_sequences=3,
        max_new_tokens=8, pad_token_id=PAD, eos_token_id=EOS, output_logits=True,
        return_dict_in_generate=True,
    )  # fmt: skip
    P = prompts["input_ids"].shape[1]
    assert roll.prompt_length == P and roll.input_ids.shape[0] == 6
    new = gen.sequences[:, P:]
    assert roll.input_ids.shape[1] == gen.sequences.shape[1]  # same number of decode steps
    for row in range(6):
        m = roll.response_mask[row, P:].bool()
        # raw ids kept: the masked response is exactly what generate sampled, up to and including eos
        assert torch.equal(roll.input_ids[row, P:][m], new[row][: int(m.sum())])
        ids = new[row].tolist()
        n = ids.index(EOS) + 1 if EOS in ids else len(ids)
        assert int(m.sum()) == n == int(roll.lengths[row]) and bool(roll.truncated[row]) == (EOS not in ids)
        assert m[:n].all() and not m[n:].any()
        assert roll.attention_mask[row, P:].tolist() == roll.response_mask[row, P:].tolist()
        assert torch.equal(roll.input_ids[row, :P], prompts["input_ids"][row // 3])  # group-major rows
    assert not roll.response_mask[:, :P].any()
    assert roll.images["pixel_values"].shape[0] == 6
    # log-probs recomputed by one forward equal the sampling distribution's (same positions, same temperature)
    logps, mask, _ = batch_token_logps(model, roll.batch(), temperature=0.7)
    assert response_window(roll.response_mask) == P and logps.shape == (6, new.shape[1])
    ref = (
        torch.log_softmax(torch.stack(gen.logits, 1).float() / 0.7, -1)
        .gather(-1, new.unsqueeze(-1))
        .squeeze(-1)
    )
    assert torch.allclose(logps[mask.bool()], ref[mask.bool()], atol=1e-4)


def test_merge_rollouts_keeps_each_row(loaded):
    model, _, prompts = loaded
    a = _roll(model, {k: v[:1] for k, v in prompts.items()}, seed=1, max_new_tokens=4)
    b = _roll(model, {k: v[1:] for k, v in prompts.items()}, seed=2, max_new_tokens=8)
    merged = merge_rollouts([(a, [0, 1, 2]), (b, [0, 1, 2])], pad_id=PAD)
    assert merged.input_ids.shape[0] == 6 and merged.response_ids() == a.response_ids() + b.response_ids()
    la = batch_token_logps(model, a.batch())[0].sum(-1)
    lb = batch_token_logps(model, b.batch())[0].sum(-1)
    lm = batch_token_logps(model, merged.batch())[0].sum(-1)
    assert torch.allclose(lm, torch.cat([la, lb]), atol=1e-4)
    # all rows of one rollout, in order, merge to the same tensors (the GRPO step then skips the merge)
    same = merge_rollouts([(b, list(range(b.input_ids.shape[0])))], pad_id=PAD)
    assert all(torch.equal(x, y) for x, y in zip(same.batch().values(), b.batch().values()))
    assert torch.equal(same.lengths, b.lengths) and same.prompt_length == b.prompt_length


def test_text_only_lm_rollout():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    lm = Qwen2ForCausalLM(cfg)
    prompts = {
        "input_ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
        "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
    }
    roll = _roll(lm, prompts, max_new_tokens=5)
    assert roll.images == {} and roll.input_ids.shape[0] == 6
    logps, mask, ent = batch_token_logps(lm, roll.batch(), with_entropy=True)
    assert logps.shape == mask.shape == ent.shape and bool((logps[mask == 0] == 0).all())


def test_bad_inputs(loaded):
    model, _, prompts = loaded
    right = {**prompts, "attention_mask": prompts["attention_mask"].flip(-1)}
    with pytest.raises(ValueError, match="left padded"):
        _roll(model, right)
    with pytest.raises(ValueError, match="group_size"):
        _roll(model, prompts, group_size=0)
    with pytest.raises(ValueError, match="no response token"):
        response_window(torch.zeros(2, 3, dtype=torch.long))


def _tiny_lm(vocab: int = 40, attn: str = "sdpa", **gen_config):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    cfg._attn_implementation = attn
    lm = Qwen2ForCausalLM(cfg).eval()
    assert lm.config._attn_implementation == attn
    for k, v in gen_config.items():
        setattr(lm.generation_config, k, v)
    return lm


PROMPT_IDS = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 3], [0, 4, 4, 1]])
PADDED = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])


@pytest.mark.parametrize(
    "attn, temperature, top_p, eos, impl",
    [
        (PADDED, 0.7, 1.0, 2, "sdpa"),  # left padding (4-D bool mask made once), temperature
        (PADDED, 0.7, 1.0, 2, "eager"),  # left padding, 2-D mask grown per step
        (torch.ones_like(PADDED), 1.0, 0.8, 2, "sdpa"),  # no padding (mask dropped, as generate), top-p
        (PADDED, 1.3, 0.9, 11, "sdpa"),  # another eos
        (PADDED, 1.0, 1.0, 0, "sdpa"),  # eos == pad
    ],
)
def test_decode_loop_samples_exactly_what_generate_samples(attn, temperature, top_p, eos, impl):
    lm = _tiny_lm(attn=impl, suppress_tokens=[3])
    prompts = {"input_ids": PROMPT_IDS, "attention_mask": attn}
    kw = dict(temperature=temperature, top_p=top_p, max_new_tokens=10)
    for seed in range(3):
        torch.manual_seed(seed)
        with torch.no_grad():
            ref = lm.generate(
                **prompts, do_sample=True, top_k=0, num_return_sequences=4, pad_token_id=PAD,
                eos_token_id=eos,
                **kw,
            )  # fmt: skip
        rng_after_generate = torch.get_rng_state()
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = sample_tokens(
                lm, prompts, group_size=4, eos_id=eos, pad_id=PAD, sampler="multinomial", **kw
            )
        assert torch.equal(out, ref)  # same tokens, same length (stops when every row has ended)
        assert torch.equal(torch.get_rng_state(), rng_after_generate)  # same draws from the generator
        assert not (out[:, 4:] == 3).any()  # suppressed token never sampled


def test_decode_loop_greedy_equals_generate():
    lm = _tiny_lm()
    prompts = {"input_ids": PROMPT_IDS, "attention_mask": PADDED}
    with torch.no_grad():
        ref = lm.generate(**prompts, do_sample=False, max_new_tokens=9, pad_token_id=PAD, eos_token_id=EOS)
        out = sample_tokens(
            lm, prompts, group_size=1, max_new_tokens=9, eos_id=EOS, pad_id=PAD, do_sample=False
        )
    assert torch.equal(out, ref)


def test_decode_loop_stops_when_every_row_has_ended():
    lm = _tiny_lm()

    def eos_dominates(module, inputs, logits):
        return logits.index_add(-1, torch.tensor([EOS]), torch.full((*logits.shape[:-1], 1), 100.0))

    lm.lm_head.register_forward_hook(eos_dominates)
    with torch.no_grad():
        prompts = {"input_ids": PROMPT_IDS, "attention_mask": PADDED}
        out = sample_tokens(lm, prompts, group_size=2, max_new_tokens=8, eos_id=EOS, pad_id=PAD)
    assert out.shape == (6, 5) and (out[:, 4] == EOS).all()


def test_other_logits_processors_fall_back_to_generate():
    lm = _tiny_lm(repetition_penalty=1.5)
    assert not decode_loop_supported(lm) and decode_loop_supported(_tiny_lm())
    prompts = {"input_ids": PROMPT_IDS, "attention_mask": PADDED}
    roll = _roll(lm, prompts, max_new_tokens=6)
    torch.manual_seed(0)
    with torch.no_grad():
        ref = lm.generate(
            **prompts, do_sample=True, temperature=0.7, top_p=1.0, top_k=0, num_return_sequences=3,
            max_new_tokens=6, pad_token_id=PAD, eos_token_id=EOS,
        )  # fmt: skip
    assert roll.response_ids() == _roll(lm, prompts, max_new_tokens=6).response_ids()
    P = PROMPT_IDS.shape[1]
    mask = roll.response_mask[:, P:].bool()
    assert torch.equal(roll.input_ids[:, P:][mask], ref[:, P:][mask])


def test_rollout_ids_train_with_autograd():
    """Sampling runs under inference_mode; the rollout tensors still work in a training forward."""
    lm = _tiny_lm().train()
    roll = _roll(lm, {"input_ids": PROMPT_IDS, "attention_mask": PADDED}, max_new_tokens=4)
    logps, mask, _ = batch_token_logps(lm, roll.batch())
    (logps * mask).sum().backward()
    assert lm.lm_head.weight.grad is not None and lm.training


def test_decode_loop_through_a_lora_wrapper_equals_generate():
    from peft import LoraConfig, get_peft_model

    lm = get_peft_model(
        _tiny_lm(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    prompts = {"input_ids": PROMPT_IDS, "attention_mask": PADDED}
    torch.manual_seed(4)
    with torch.no_grad():
        ref = lm.generate(
            **prompts, do_sample=True, top_k=0, temperature=0.9, num_return_sequences=2, max_new_tokens=6,
            pad_token_id=PAD, eos_token_id=EOS,
        )  # fmt: skip
    torch.manual_seed(4)
    with torch.inference_mode():
        out = sample_tokens(
            lm, prompts, group_size=2, max_new_tokens=6, eos_id=EOS, pad_id=PAD, temperature=0.9,
            sampler="multinomial",
        )  # fmt: skip
    assert decode_loop_supported(lm) and torch.equal(out, ref)


def test_inverse_cdf_draws_follow_the_probabilities():
    """One uniform per row against the cumulative probabilities: the multinomial distribution, never a
    zero-probability entry (suppressed, cut by top-p, or at either end of the vocabulary)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 9, dtype=torch.float64) * 2
    logits[0, 4] = logits[1, 0] = logits[2, 8] = -float("inf")  # middle, first and last entries
    probs = torch.softmax(logits, dim=-1)
    n = 40_000
    counts = torch.zeros_like(probs)
    for _ in range(n // 1000):
        draws = draw_inverse_cdf(probs.repeat(1000, 1)).view(1000, 3)  # (1000, 3)
        counts += torch.nn.functional.one_hot(draws, 9).sum(0)
    freq = counts / n
    assert counts[0, 4] == counts[1, 0] == counts[2, 8] == 0
    sigma = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 5 * sigma + 1e-12).all(), (freq - probs).abs().max()
    one_hot = torch.zeros(2, 5)
    one_hot[0, 3] = one_hot[1, 4] = 1.0
    assert draw_inverse_cdf(one_hot).tolist() == [3, 4]  # a certain token, also the last one


def test_default_sampler_respects_suppression_and_top_p():
    lm = _tiny_lm(vocab=12, suppress_tokens=[3])
    prompts = {"input_ids": PROMPT_IDS, "attention_mask": PADDED}
    with torch.inference_mode():
        first = lm(**prompts).logits[:, -1].float()  # (3, V) the first sampled position's logits
        first[:, 3] = -float("inf")
        allowed = _top_p_filter(first, 0.6) > -float("inf")  # (3, V) what top-p 0.6 keeps
        seen = torch.zeros_like(allowed)
        for seed in range(40):
            torch.manual_seed(seed)
            out = sample_tokens(
                lm, prompts, group_size=8, max_new_tokens=3, eos_id=EOS, pad_id=PAD, top_p=0.6
            )
            seen |= torch.nn.functional.one_hot(out[:, 4], 12).view(3, 8, 12).any(1).bool()
    assert not (out[:, 4:] == 3).any() and not seen[:, 3].any()
    assert not (seen & ~allowed).any()  # nothing outside the nucleus
    assert seen.sum() > 3  # and it does sample (not argmax)
    with pytest.raises(ValueError, match="unknown sampler"):
        sample_tokens(lm, prompts, group_size=1, max_new_tokens=1, eos_id=EOS, pad_id=PAD, sampler="gumbel")
