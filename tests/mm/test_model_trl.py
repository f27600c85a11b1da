"""NoteVLM under TRL's SFTTrainer (its fused LM-head loss reads `base_model` hidden states + `lm_head`)."""

from __future__ import annotations

import torch

from tests.helpers.model import random_images, tiny_model, tiny_processor


def test_trl_sft_trainer_two_steps(tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model, proc = tiny_model().train(), tiny_processor()
    samples = [
        proc.encode(random_images(1 + i % 3, seed=i), "describe the note", "a red cat") for i in range(8)
    ]
    ds = Dataset.from_list([{k: v.tolist() for k, v in s.items()} for s in samples]).with_format("torch")
    fusion_before = [p.detach().clone() for p in model.fusion.parameters()]
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        remove_unused_columns=False,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        dataset_kwargs={"skip_prepare_dataset": True},
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=ds, data_collator=proc.collate, processing_class=proc.tokenizer
    )
    out = trainer.train()
    assert out.global_step == 2 and torch.isfinite(torch.tensor(out.training_loss))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2
    assert any(not torch.equal(a, b) for a, b in zip(fusion_before, model.fusion.parameters()))
    # TRL patched the forward: its fused loss equals the model's own loss on the same batch
    model.eval()
    batch = proc.collate(samples[:4])
    with torch.no_grad():
        own = model(**batch).loss
        fused = model(**batch, fused_lm_head=True).loss
    torch.testing.assert_close(fused, own, rtol=1e-5, atol=1e-5)
