"""The model adapter over tiny random LLaVA, Qwen2-VL and Idefics3 models saved with their processors.

Per family: generation, answer log-probs against a hand-written full forward, batching against one by
one, greedy generation scored back as the argmax, LoRA (only adapters train, a step moves the
log-probs) and the merged folder loaded by plain transformers in a process without notelens.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mm.errors import UserError
from mm.model.adapter import Sample, load_adapter
from mm.model.adapter.batching import TOKEN_KEYS
from mm.model.adapter.hf import TransformersAdapter
from tests.mm.adapter_helpers import BUILDERS, build_family, random_image

FAMILIES = list(BUILDERS)
LM_PREFIX = {
    "llava": "model.language_model.",
    "llava_next": "model.language_model.",
    "qwen2_vl": "model.language_model.",
    "qwen2_5_vl": "model.language_model.",
    "qwen3_vl": "model.language_model.",
    "gemma3": "model.language_model.",
    "internvl": "model.language_model.",
    "idefics3": "model.text_model.",
    "smolvlm": "model.text_model.",
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: build_family(f, root / f) for f in FAMILIES}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def adapter(folders, family):
    return load_adapter(folders[family])


def _samples():
    """Different image counts and sizes, and prompts of different lengths (so rows are padded)."""
    return [
        Sample(images=[random_image(16, 16, seed=0)], text="Describe the image."),
        Sample(images=[random_image(24, 16, seed=1), random_image(32, 32, seed=2)], text="Is there a cup?"),
        Sample(images=[random_image(16, 32, seed=3)], text="What colour is the plate on the left side?"),
    ]


ANSWERS = ["A red cup on a plate.", "yes", "Blue, with a small white fork next to it."]


def _manual_logps(adapter, batch):
    """Full forward (all logits), log_softmax, gather of the next token: (B, T) with position 0 = 0."""
    inputs = {k: v for k, v in batch.items() if k != "response_mask"}
    if not adapter.spec.mrope:  # positions as generate builds them for left padding
        inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    logits = adapter.model(**inputs, use_cache=False).logits.float()  # (B, T, V)
    logp = torch.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V): column t predicts t+1
    picked = logp.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)  # (B, T-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1), logp  # (B, T)


def test_adapter_kind_and_properties(adapter, family):
    assert isinstance(adapter, TransformersAdapter)
    assert adapter.family == family
    tok = adapter.tokenizer
    assert adapter.eos_token_id == tok.eos_token_id
    assert adapter.pad_token_id == tok.pad_token_id
    assert adapter.device == torch.device("cpu")
    assert adapter.model is adapter.base_model


def test_build_prompts_family_inputs(adapter, family):
    batch = adapter.build_prompts(_samples())
    B, P = batch["input_ids"].shape
    assert B == 3 and batch["attention_mask"].shape == (B, P)
    assert bool((batch["attention_mask"][:, -1] == 1).all())  # left padded: every row ends with its prompt
    assert not bool((batch["attention_mask"] == 1).all())  # some row is padded
    expected = {"llava": "pixel_values", "llava_next": "image_sizes", "qwen2_vl": "image_grid_thw",
                "qwen2_5_vl": "image_grid_thw", "qwen3_vl": "image_grid_thw",
                "gemma3": "token_type_ids", "internvl": "pixel_values",
                "idefics3": "pixel_attention_mask", "smolvlm": "pixel_attention_mask"}  # fmt: skip
    assert expected[family] in batch
    if family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        assert batch["image_grid_thw"].shape == (4, 3) and "mm_token_type_ids" in batch
    if family == "llava_next":  # each image's own anyres patches, padded to the most in the batch
        assert batch["image_sizes"].tolist() == [[16, 16], [16, 24], [32, 32], [32, 16]]
        assert batch["pixel_values"].shape == (4, 5, 3, 16, 16)


def test_generate_returns_strings(adapter):
    samples = _samples()
    gen = adapter.generate_ids(samples, max_new_tokens=6)
    assert len(gen.texts) == 3 and all(isinstance(t, str) for t in gen.texts)
    assert all(1 <= len(ids) <= 6 for ids in gen.token_ids)
    assert gen.sequences.shape[1] <= gen.prompt_length + 6
    assert adapter.generate(samples, max_new_tokens=6) == gen.texts  # greedy is deterministic
    torch.manual_seed(0)
    sampled = adapter.generate(samples, max_new_tokens=4, do_sample=True, temperature=0.7, top_p=0.9)
    assert len(sampled) == 3 and all(isinstance(t, str) for t in sampled)


def test_answer_logps_match_manual_forward(adapter):
    samples = _samples()
    batch = adapter.answer_batch(samples, ANSWERS)
    with torch.no_grad():
        logps, mask = adapter.token_logps(batch)
        manual, _ = _manual_logps(adapter, batch)
    T = batch["input_ids"].shape[1]
    assert logps.shape == mask.shape == (3, T)
    lengths = [len(adapter.tokenizer(a, add_special_tokens=False)["input_ids"]) + 1 for a in ANSWERS]
    assert mask.sum(1).tolist() == lengths  # the answer tokens and their eos, nothing else
    for b, answer in enumerate(ANSWERS):
        ids = batch["input_ids"][b][mask[b].bool()].tolist()
        assert ids == adapter.tokenizer(answer, add_special_tokens=False)["input_ids"] + [
            adapter.eos_token_id
        ]
    assert bool((logps[mask == 0] == 0).all())
    assert bool((logps[mask == 1] < 0).all())
    torch.testing.assert_close(logps[mask == 1], manual[mask == 1], atol=1e-5, rtol=0)
    again, mask2 = adapter.answer_logps(samples, ANSWERS)  # same values through the one-call API
    torch.testing.assert_close(again.detach(), logps, atol=1e-6, rtol=0)
    assert torch.equal(mask2, mask)


def test_batched_equals_one_by_one(adapter):
    samples = _samples()
    with torch.no_grad():
        logps, mask = adapter.answer_logps(samples, ANSWERS)
        for b, (s, a) in enumerate(zip(samples, ANSWERS)):
            one, one_mask = adapter.answer_logps([s], [a])
            assert int(one_mask.sum()) == int(mask[b].sum())
            torch.testing.assert_close(logps[b][mask[b] == 1], one[0][one_mask[0] == 1], atol=1e-5, rtol=0)


def test_right_padded_batch_scores_the_same(adapter):
    """`token_logps` takes any padding layout: rows shifted to start at column 0 score the same."""
    batch = adapter.answer_batch(_samples(), ANSWERS)
    lead = (batch["attention_mask"] == 0).long().cumprod(-1).sum(-1)  # (B,) leading pads per row
    assert int(lead.max()) > 0
    right = dict(batch)
    for key in (*TOKEN_KEYS, "response_mask"):
        if key in batch:
            right[key] = torch.stack([row.roll(-int(n)) for row, n in zip(batch[key], lead)])
    assert bool((right["attention_mask"][:, 0] == 1).all())
    with torch.no_grad():
        left_logps, left_mask = adapter.token_logps(batch)
        right_logps, right_mask = adapter.token_logps(right)
    torch.testing.assert_close(right_logps[right_mask == 1], left_logps[left_mask == 1], atol=1e-5, rtol=0)


def test_greedy_tokens_score_as_argmax(adapter):
    """Generated ids fed back as answers: the prompt ids match generation's and each token is the argmax
    over every id but the image placeholders (which a random LLaVA-NeXT's argmax is, at one position)."""
    samples = _samples()
    gen = adapter.generate_ids(samples, max_new_tokens=5)
    batch = adapter.answer_batch(samples, gen.token_ids)
    P = gen.prompt_length
    assert torch.equal(batch["input_ids"][:, :P], gen.sequences[:, :P])
    with torch.no_grad():
        logps, mask = adapter.token_logps(batch)
        _, full = _manual_logps(adapter, batch)  # (B, T-1, V)
    full[..., adapter.placeholder_ids] = float("-inf")  # image placeholders are never generated
    best = full.max(-1).values  # (B, T-1)
    sel = mask[:, 1:] == 1
    torch.testing.assert_close(logps[:, 1:][sel], best[sel], atol=1e-4, rtol=0)


def test_lora_trains_only_adapters_in_the_lm(folders, family):
    adapter = load_adapter(folders[family])
    samples, answers = _samples()[:2], ANSWERS[:2]
    with torch.no_grad():
        before, mask = adapter.answer_logps(samples, answers)
    torch.manual_seed(0)  # LoRA A's init
    peft_model = adapter.apply_lora(r=4, alpha=8)
    assert adapter.model is peft_model and adapter.base_model is peft_model.get_base_model()
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    lora_modules = {n.split(".lora_")[0] for n in trainable}
    prefix = "base_model.model." + LM_PREFIX[family]
    assert all(n.startswith(prefix) for n in lora_modules)
    leaves = {n.rsplit(".", 1)[-1] for n in lora_modules}
    assert leaves == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with torch.no_grad():  # LoRA B starts at 0: the wrapped model scores as before
        same, _ = adapter.answer_logps(samples, answers)
    torch.testing.assert_close(same, before, atol=1e-6, rtol=0)
    opt = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=0.1)  # 0.5 overshoots
    logps, mask = adapter.answer_logps(samples, answers)
    (-(logps * mask).sum() / mask.sum()).backward()
    opt.step()
    with torch.no_grad():
        after, _ = adapter.answer_logps(samples, answers)
    assert float((after - before)[mask == 1].abs().max()) > 1e-4
    assert float((after * mask).sum()) > float((before * mask).sum())  # the step made the answers likelier
    with pytest.raises(UserError, match="already applied"):
        adapter.apply_lora()


def test_lora_custom_targets_never_hit_the_vision_tower(folders, family):
    adapter = load_adapter(folders[family])
    adapter.apply_lora(r=2, alpha=4, target_modules=["q_proj"])
    hits = {n.split(".lora_")[0] for n, _ in adapter.model.named_parameters() if ".lora_A" in n}
    assert len(hits) == 2  # one per LM layer; the vision tower's q_proj (LLaVA, Idefics3) is left alone
    assert all(n.startswith("base_model.model." + LM_PREFIX[family]) for n in hits)
    with pytest.raises(UserError, match="match no module"):
        load_adapter(folders[family]).apply_lora(target_modules=["no_such_proj"])


SITE_PACKAGES = str(Path(torch.__file__).resolve().parents[1])
MERGED_CHECK = textwrap.dedent(
    """
    import sys
    sys.path.append(sys.argv[3])  # site-packages without its .pth files: notelens's editable install is off
    import importlib.util, json
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    assert importlib.util.find_spec("mm") is None, "notelens must not be importable here"
    out = {}
    for family, folder in json.loads(sys.argv[1]).items():
        model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()
        AutoProcessor.from_pretrained(folder, local_files_only=True)
        batch = torch.load(folder + "/batch.pt")
        with torch.no_grad():
            out[family] = model(**batch, use_cache=False).logits
    torch.save(out, sys.argv[2])
    """
)


def test_merge_and_save_loads_in_plain_transformers(folders, tmp_path):
    """LoRA-trained model merged and saved; a `python -I -S` process (no notelens) gets the same logits."""
    expected, where = {}, {}
    for family in FAMILIES:
        adapter = load_adapter(folders[family])
        adapter.apply_lora(r=4, alpha=8)
        samples = _samples()[:2]
        opt = torch.optim.SGD([p for p in adapter.model.parameters() if p.requires_grad], lr=0.5)
        logps, mask = adapter.answer_logps(samples, ANSWERS[:2])
        (-(logps * mask).sum()).backward()
        opt.step()
        batch = {k: v for k, v in adapter.answer_batch(samples, ANSWERS[:2]).items() if k != "response_mask"}
        with torch.no_grad():
            expected[family] = adapter.model(**batch, use_cache=False).logits
        out = adapter.merge_and_save(tmp_path / family)
        assert (out / "adapter" / "adapter_config.json").is_file()
        assert (out / "config.json").is_file() and (out / "processor_config.json").is_file()
        assert not hasattr(adapter.model, "peft_config")  # merged in place
        torch.save(batch, out / "batch.pt")
        where[family] = str(out)
    result = tmp_path / "logits.pt"
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", MERGED_CHECK, json.dumps(where), str(result), SITE_PACKAGES],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(result)
    for family in FAMILIES:
        torch.testing.assert_close(got[family], expected[family], atol=1e-5, rtol=1e-5)
        # the merged folder also reloads through load_adapter as an ordinary transformers model
        assert isinstance(load_adapter(where[family]), TransformersAdapter)


# ---------------------------------------------------------------- bad inputs


def test_bad_inputs(folders, tmp_path):
    adapter = load_adapter(folders["llava"])
    with pytest.raises(UserError, match="local model folders only"):
        load_adapter(tmp_path / "missing")
    with pytest.raises(UserError, match="config.json not found"):
        load_adapter(tmp_path)
    with pytest.raises(UserError, match="without its processor"):
        load_adapter(adapter.model)
    with pytest.raises(UserError, match="only with a loaded model"):
        load_adapter(folders["llava"], adapter.processor)
    with pytest.raises(UserError, match="unknown dtype"):
        load_adapter(folders["llava"], dtype="float13")
    with pytest.raises(ValueError, match="at least one image"):
        Sample(images=[], text="hi")
    with pytest.raises(TypeError, match="list of images"):
        Sample(images=random_image(16, 16), text="hi")
    samples = _samples()
    with pytest.raises(ValueError, match="one answer per sample"):
        adapter.answer_logps(samples, ANSWERS[:2])
    with pytest.raises(ValueError, match="no answer"):
        adapter.answer_logps(samples)
    with pytest.raises(ValueError, match="no tokens"):
        adapter.answer_logps(samples[:1], [[]])
    wrapped = load_adapter(adapter.model, adapter.processor)  # a loaded model + processor works too
    assert isinstance(wrapped, TransformersAdapter)
    with_answers = [Sample(images=s.images, text=s.text, answer=a) for s, a in zip(samples, ANSWERS)]
    with torch.no_grad():
        a, _ = adapter.answer_logps(with_answers)
        b, _ = adapter.answer_logps(samples, ANSWERS)
    assert torch.equal(a, b)


def test_bfloat16_weights_score_in_float32(folders):
    """dtype= casts the weights; image inputs follow the model's dtype; log-probs come back float32."""
    adapter = load_adapter(folders["qwen2_vl"], dtype="bfloat16")
    assert adapter.dtype == torch.bfloat16
    batch = adapter.answer_batch(_samples(), ANSWERS)
    assert batch["pixel_values"].dtype == torch.bfloat16
    with torch.no_grad():
        logps, mask = adapter.token_logps(batch)
        full, _ = load_adapter(folders["qwen2_vl"]).answer_logps(_samples(), ANSWERS)
    assert logps.dtype == torch.float32 and bool(torch.isfinite(logps).all())
    assert float((logps - full)[mask == 1].abs().max()) < 0.05  # bf16 rounding (about 1e-3 here)
