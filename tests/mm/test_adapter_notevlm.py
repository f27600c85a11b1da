"""NoteVLM behind the adapter: parity with the RL trainers' log-probs, NoteProcessor's tokenisation and
`mm.eval.generate`, batching, LoRA (the project's preset) and the merged save."""

from __future__ import annotations

import pytest
import torch

from mm.model.adapter import Sample, load_adapter
from mm.model.adapter.notevlm import NoteVLMAdapter
from rl.trainers.common import batch_token_logps
from tests.helpers.model import random_images, tiny_model, tiny_processor

PROMPTS = ["describe the note", "is there a cat in image 2", "is there a red cup"]
ANSWERS = ["a red cat", "yes", "no the cup is blue"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("notevlm")
    tiny_model(seed=3).save_pretrained(d)
    tiny_processor().save_pretrained(d)
    return d


@pytest.fixture
def adapter(folder):
    return load_adapter(folder)


def _samples():
    counts = (1, 3, 2)
    return [Sample(images=random_images(n, seed=i), text=p) for i, (n, p) in enumerate(zip(counts, PROMPTS))]


def _parity(adapter, samples):
    batch = adapter.answer_batch(samples, ANSWERS)
    with torch.no_grad():
        ours, mask = adapter.token_logps(batch)
        ref, ref_mask, _ = batch_token_logps(adapter.model, batch)  # (B, W) from the first answer column
    start = batch["input_ids"].shape[1] - ref.shape[1]
    assert torch.equal(mask[:, start:], ref_mask.long()) and int(mask[:, :start].sum()) == 0
    torch.testing.assert_close(ours[:, start:], ref.float(), atol=1e-6, rtol=0)
    assert bool((ours[:, :start] == 0).all())
    return ours, mask


def test_folder_gives_notevlm_adapter(adapter):
    assert isinstance(adapter, NoteVLMAdapter) and adapter.family == "notevlm"
    assert adapter.eos_token_id == adapter.tokenizer.eos_token_id == 2
    assert adapter.pad_token_id == 0


def test_answer_logps_equal_rl_batch_token_logps(adapter):
    _parity(adapter, _samples())


def test_answer_tokens_are_the_processors_labels(adapter):
    """The scored tokens are exactly the tokens SFT learns (NoteProcessor.encode labels)."""
    samples = _samples()
    batch = adapter.answer_batch(samples, ANSWERS)
    proc = adapter.processor
    for b, (s, a) in enumerate(zip(samples, ANSWERS)):
        enc = proc.encode(list(s.images), s.text, a)
        learned = enc["input_ids"][enc["labels"] != -100].tolist()
        assert batch["input_ids"][b][batch["response_mask"][b] == 1].tolist() == learned
        prompt = enc["input_ids"][enc["labels"] == -100].tolist()
        row = batch["input_ids"][b][(batch["attention_mask"][b] == 1) & (batch["response_mask"][b] == 0)]
        assert row.tolist() == prompt


def test_batched_equals_one_by_one(adapter):
    samples = _samples()
    with torch.no_grad():
        logps, mask = adapter.answer_logps(samples, ANSWERS)
        for b, (s, a) in enumerate(zip(samples, ANSWERS)):
            one, one_mask = adapter.answer_logps([s], [a])
            torch.testing.assert_close(logps[b][mask[b] == 1], one[0][one_mask[0] == 1], atol=1e-5, rtol=0)


def test_generate_matches_eval_generate(adapter):
    from mm.eval.generate import generate

    samples = _samples()
    texts = adapter.generate(samples, max_new_tokens=5)
    ref = generate(
        adapter.model, adapter.processor, [list(s.images) for s in samples], PROMPTS, max_new_tokens=5
    )
    assert texts == ref and all(isinstance(t, str) for t in texts)
    gen = adapter.generate_ids(samples, max_new_tokens=5)
    assert all(1 <= len(ids) <= 5 for ids in gen.token_ids)
    assert adapter.processor.image_token_id not in {t for ids in gen.token_ids for t in ids}


def test_lora_parity_step_and_merged_save(adapter, tmp_path):
    samples = _samples()[:2]
    peft_model = adapter.apply_lora(r=4, alpha=8)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable)
    assert all("lora_" in n or ".fusion." in n for n in trainable)  # the preset trains the fusion whole
    assert not any("vision_tower" in n for n in trainable)
    _parity(adapter, _samples())  # through the PeftModel too
    with torch.no_grad():
        before, mask = adapter.answer_logps(samples, ANSWERS[:2])
    opt = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=0.5)
    logps, mask = adapter.answer_logps(samples, ANSWERS[:2])
    (-(logps * mask).sum()).backward()
    opt.step()
    with torch.no_grad():
        after, _ = adapter.answer_logps(samples, ANSWERS[:2])
    assert float((after - before)[mask == 1].abs().max()) > 1e-4
    out = adapter.merge_and_save(tmp_path / "merged")
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "note_processor.json").is_file()
    reloaded = load_adapter(out)
    with torch.no_grad():
        again, _ = reloaded.answer_logps(samples, ANSWERS[:2])
    torch.testing.assert_close(again, after, atol=1e-5, rtol=0)


def test_loaded_model_and_custom_targets(adapter):
    wrapped = load_adapter(adapter.model, adapter.processor)
    assert isinstance(wrapped, NoteVLMAdapter)
    wrapped.apply_lora(r=2, alpha=4, target_modules=["q_proj"])
    hits = {n.split(".lora_A")[0] for n, _ in wrapped.model.named_parameters() if ".lora_A" in n}
    assert len(hits) == 2 and all(".language_model.layers." in n for n in hits)
