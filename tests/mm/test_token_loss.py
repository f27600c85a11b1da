"""mm.train.token_loss: the weighted SFT loss (float64 golden values, equality with transformers' loss)."""

from __future__ import annotations

import math

import pytest
import torch

from mm.train.token_loss import token_weights, weighted_token_loss
from tests.helpers.sft import make_world, tiny_train_config


def _case():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=g, dtype=torch.float64)  # (B, T, V)
    labels = torch.randint(0, 11, (3, 6), generator=g)
    labels[:, :2] = -100  # prompt
    labels[1, 4:] = -100  # padding
    return logits, labels


def test_unit_weights_equal_transformers_causal_lm_loss():
    from transformers.loss.loss_utils import ForCausalLMLoss

    logits, labels = _case()
    n = (labels[:, 1:] != -100).sum()
    ours = weighted_token_loss(logits, labels, torch.ones(3, dtype=torch.float64), n.double())
    ref = ForCausalLMLoss(logits, labels, 11, num_items_in_batch=n)
    assert ours.dtype == torch.float64
    assert ours.item() == pytest.approx(ref.item(), abs=1e-6)


def test_weighted_loss_golden_value_from_the_formula():
    logits, labels = _case()
    w = torch.tensor([1.0, 5.0, 0.5], dtype=torch.float64)
    num, den = 0.0, 0.0
    for b in range(3):
        for t in range(5):  # position t predicts labels[b, t + 1]
            y = int(labels[b, t + 1])
            if y == -100:
                continue
            row = logits[b, t]
            ce = math.log(sum(math.exp(v) for v in row.tolist())) - row[y].item()
            num += w[b].item() * ce
            den += w[b].item()
    tw = token_weights(labels, w)
    assert tw.shape == (3, 5) and tw.sum().item() == pytest.approx(den)
    assert tw[1, 3:].eq(0).all() and tw[:, 0].eq(0).all()
    assert weighted_token_loss(logits, labels, w, tw.sum()).item() == pytest.approx(num / den, abs=1e-12)


def _tiny_sft(tmp_path, tasks, **samples):
    """(config, random tiny model, processor, samples of 3 world notes) for the SFT loss tests."""
    from mm.config import load_config
    from mm.data.format import read_notes
    from mm.train import common, sft
    from mm.train.sft_data import SampleSet, load_note_images
    from mm.train.tasks import build_samples

    world = make_world(tmp_path / "notes", notes=10)
    notes = read_notes(world, "train")[:3]
    cfg = load_config(sft.TrainConfig, tiny_train_config(tmp_path / "c.yaml", tasks=tasks))
    common.seed_everything(0)
    model, proc, _ = sft.build_model_and_processor(cfg)
    data = SampleSet(
        processor=proc, images=load_note_images(notes, world, proc.image_size),
        samples=build_samples(notes, **samples),
    )  # fmt: skip
    return cfg, model, proc, data


def test_question_weight_rejects_nonpositive(tmp_path):
    from mm.config import load_config
    from mm.train.sft import TrainConfig

    for bad in (0.0, -1.0, float("inf")):
        path = tiny_train_config(tmp_path / "c.yaml", tasks={"question_weight": bad})
        with pytest.raises(ValueError, match="question_weight"):
            load_config(TrainConfig, path)
    with pytest.raises(ValueError, match="answer_style"):
        load_config(TrainConfig, tiny_train_config(tmp_path / "s.yaml", tasks={"answer_style": "sentence"}))


def test_question_weight_scales_question_tokens_in_a_training_step(tmp_path):
    """Weight 1 takes the model's own loss; a weight w gives the weighted mean over kinds."""
    from mm.train import sft

    cfg, model, proc, data = _tiny_sft(tmp_path, {"question_weight": 4.0}, questions_per_note=1)
    idx = list(range(len(data)))
    kinds = [data.samples[i].kind for i in idx]
    assert {"caption", "question"} <= set(kinds)
    w = sft.sample_weights(data, idx, cfg.tasks)
    assert w.tolist() == [4.0 if k == "question" else 1.0 for k in kinds]
    batch = data.batch(idx)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        raw = logits
        # a random-init model is near uniform: make the question answers easy so the two kinds' losses differ
        logits = raw.clone()
        for i in idx:
            if kinds[i] == "question":
                for t in range(logits.shape[1] - 1):
                    if batch["labels"][i, t + 1] != -100:
                        logits[i, t, batch["labels"][i, t + 1]] += 10.0
        ce = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], ignore_index=-100, reduction="none"
        )  # (B, T-1)
        mask = batch["labels"][:, 1:] != -100
        rows = {k: [i for i in idx if kinds[i] == k] for k in ("caption", "question")}
        per_kind = {k: (ce[r].sum(), mask[r].sum()) for k, r in rows.items()}
        want = (per_kind["caption"][0] + 4 * per_kind["question"][0]) / (
            per_kind["caption"][1] + 4 * per_kind["question"][1]
        )
        div = sft.answer_token_divisor(batch["labels"], 1, w)
        # group_by_length divides by the data's mean weighted answer tokens per sample x the batch size
        assert sft.mean_answer_tokens(data, cfg.tasks) * len(idx) == pytest.approx(div.item())
        got = weighted_token_loss(logits, batch["labels"], w, div)
        assert got.item() == pytest.approx(want.item(), rel=1e-5)
        plain = model(**batch, num_items_in_batch=sft.answer_token_divisor(batch["labels"], 1)).loss
        ones = weighted_token_loss(raw, batch["labels"], torch.ones(len(idx)), mask.sum())
        assert ones.item() == pytest.approx(plain.item(), rel=1e-5)
        mean = {k: (s / n).item() for k, (s, n) in per_kind.items()}
        assert abs(mean["caption"] - mean["question"]) > 0.5 * mean["caption"]
        unweighted = weighted_token_loss(logits, batch["labels"], torch.ones(len(idx)), mask.sum())
        assert got.item() != pytest.approx(unweighted.item(), rel=1e-2)


@pytest.mark.parametrize("tasks", [{"question_weight": 8.0}, {"colour_weight": 4.0, "question_weight": 2.0}])
def test_train_cli_runs_with_loss_weights(tmp_path, tasks):
    from mm.cli import main

    world = make_world(tmp_path / "notes", notes=16)
    cfg = tiny_train_config(tmp_path / "c.yaml", tasks=tasks, data={"folder": str(world)})
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    import json

    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in recs if "loss" in r)
    assert (tmp_path / "run" / "model" / "config.json").exists()


def test_answer_positions_loss_equals_the_full_head_loss():
    from mm.train.token_loss import answer_positions_loss

    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 6, 5, generator=g, dtype=torch.float64)  # (B, T, D)
    head = torch.nn.Linear(5, 11, bias=False).double()
    _, labels = _case()
    w = torch.tensor([2.0, 1.0, 0.25], dtype=torch.float64)
    div = token_weights(labels, w).sum()
    full = weighted_token_loss(head(hidden), labels, w, div)
    assert answer_positions_loss(hidden, head, labels, w, div).item() == pytest.approx(full.item(), abs=1e-12)
    n = (labels[:, 1:] != -100).sum().double()
    ones = weighted_token_loss(head(hidden), labels, torch.ones(3, dtype=torch.float64), n)
    got = answer_positions_loss(hidden, head, labels, None, n)
    assert got.item() == pytest.approx(ones.item(), abs=1e-12)


@pytest.mark.parametrize("lora", [False, True])
def test_sft_answer_loss_equals_the_model_loss_and_its_gradients(tmp_path, lora):
    """The training step's loss (head on answer positions only) = the model's own loss, same gradients."""
    from mm.config import load_config
    from mm.data.format import read_notes
    from mm.train import common, sft
    from mm.train.sft_data import SampleSet, load_note_images
    from mm.train.tasks import build_samples

    world = make_world(tmp_path / "notes", notes=10)
    notes = read_notes(world, "train")[:3]
    cfg = load_config(sft.TrainConfig, tiny_train_config(tmp_path / "c.yaml", lora={"enabled": lora}))
    common.seed_everything(0)
    model, proc, _ = sft.build_model_and_processor(cfg)
    model, _ = sft.prepare_trainable(model, cfg)
    data = SampleSet(
        processor=proc, images=load_note_images(notes, world, proc.image_size),
        samples=build_samples(notes, questions_per_note=1),
    )  # fmt: skip
    batch = data.batch(list(range(len(data))))
    params = [p for p in model.parameters() if p.requires_grad]
    div = sft.answer_token_divisor(batch["labels"], 1)
    ref = model(**batch, num_items_in_batch=div).loss
    ref_grads = torch.autograd.grad(ref, params)
    ours = sft.answer_loss(model, batch, None, div)
    grads = torch.autograd.grad(ours, params)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_heavy_token_weights_golden():
    logits, labels = _case()
    heavy = torch.tensor([int(labels[0, 3]), int(labels[2, 5])])  # two of the answer ids
    w = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    tw = token_weights(labels, w, heavy_ids=heavy, heavy_weight=5.0)
    num, den = 0.0, 0.0
    for b in range(3):
        for t in range(5):
            y = int(labels[b, t + 1])
            if y == -100:
                assert tw[b, t] == 0
                continue
            k = w[b].item() * (5.0 if y in heavy.tolist() else 1.0)
            assert tw[b, t].item() == k
            row = logits[b, t]
            num += k * (math.log(sum(math.exp(v) for v in row.tolist())) - row[y].item())
            den += k
    assert den > float(token_weights(labels, w).sum())  # some answer token is heavy
    got = weighted_token_loss(logits, labels, tw, tw.sum())  # (B, T-1) weights: one per predicted token
    assert got.item() == pytest.approx(num / den, abs=1e-12)
    assert torch.equal(token_weights(labels, w, heavy_ids=heavy), token_weights(labels, w))  # weight 1


def test_colour_weight_weighs_the_colour_words(tmp_path):
    from mm.config import load_config
    from mm.eval.claims.extract import COLOR_WORDS
    from mm.train import sft
    from mm.train.sft.loss import batch_weights, colour_token_ids

    cfg, _, proc, data = _tiny_sft(tmp_path, {"colour_weight": 3.0})
    tok = proc.tokenizer
    ids = colour_token_ids(tok)
    assert {tok.decode([i]).strip() for i in ids.tolist()} >= {"red", "blue"}
    assert all(tok.decode([i]).strip().lower() in COLOR_WORDS for i in ids.tolist())
    idx = list(range(len(data)))
    batch = data.batch(idx)
    w = batch_weights(data, idx, batch["labels"], cfg.tasks, ids)
    target = batch["labels"][:, 1:]
    colour = torch.isin(target, ids)
    assert colour.any() and w.shape == target.shape
    assert (
        w[colour].eq(3.0).all()
        and w[(target != -100) & ~colour].eq(1.0).all()
        and w[target == -100].eq(0).all()
    )
    assert sft.answer_token_divisor(batch["labels"], 1, w).item() == pytest.approx(float(w.sum()))
    assert sft.mean_answer_tokens(data, cfg.tasks, ids) * len(idx) == pytest.approx(float(w.sum()))
    plain = load_config(sft.TrainConfig, tiny_train_config(tmp_path / "p.yaml"))
    assert batch_weights(data, idx, batch["labels"], plain.tasks, ids) is None
    for bad in (0.0, float("nan")):
        with pytest.raises(ValueError, match="colour_weight"):
            load_config(sft.TrainConfig, tiny_train_config(tmp_path / "b.yaml", tasks={"colour_weight": bad}))
