"""Rollouts keep the raw sampled ids, mask exactly the generated tokens, and score them as generate did."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mm"))

from test_eval_model_fixtures import make_data_dir, make_model_dir  # noqa: E402

from rl.trainers.common import batch_token_logps, response_window  # noqa: E402
from rl.trainers.rollout import generate_rollout, merge_rollouts, response_mask_from_ids  # noqa: E402

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
    return generate_rollout(model, prompts, **{**args, **kw})


def test_rollout_keeps_sampled_ids_masks_and_generation_logps(loaded):
    model, processor, prompts = loaded
    assert processor.tokenizer.eos_token_id == EOS and processor.tokenizer.pad_token_id == PAD
    roll = _roll(model, prompts)
    torch.manual_seed(0)
    gen = model.generate(
        **prompts, do_sample=True, temperature=0.7, top_p=1.0, top_k=0, num_return_sequences=3,
        max_new_tokens=8, pad_token_id=PAD, eos_token_id=EOS, output_logits=True,
        return_dict_in_generate=True,
    )  # fmt: skip
    P = prompts["input_ids"].shape[1]
    assert roll.prompt_length == P and roll.input_ids.shape[0] == 6
    new = gen.sequences[:, P:]
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
