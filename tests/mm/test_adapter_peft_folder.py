"""load_adapter on a PEFT adapter folder (what TRL writes under LoRA): the base loaded, the adapter merged,
the same log-probs as the PEFT model; the base found by absolute or relative path, or a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mm.errors import UserError
from mm.model.adapter import Sample, load_adapter
from tests.helpers.eval_model import make_model_dir
from tests.mm.adapter_helpers import build_family, random_image

SAMPLES = [Sample(images=[random_image(32, 24, 1)], text="Describe the photo.")]


def _trained_adapter(base: Path, out: Path, *, processor: bool = False) -> tuple[Path, torch.Tensor]:
    """A LoRA on ``base`` with non-zero B (so it changes the outputs), saved as PEFT saves it; and the
    PEFT model's log-probs of an answer."""
    adapter = load_adapter(str(base))
    adapter.apply_lora(r=4)
    torch.manual_seed(1)
    for name, p in adapter.model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.1)
    adapter.model.save_pretrained(str(out))
    if processor:
        adapter.processor.save_pretrained(str(out))
    with torch.no_grad():
        logps, _ = adapter.answer_logps(SAMPLES, ["a red cup"])
    return out, logps


@pytest.mark.parametrize("family", ["qwen2_vl", "notevlm"])
def test_an_adapter_folder_loads_merged_on_its_base(family, tmp_path):
    base = (
        make_model_dir(tmp_path / "base") if family == "notevlm" else build_family(family, tmp_path / "base")
    )
    folder, want = _trained_adapter(base, tmp_path / "adapter")
    assert not (folder / "config.json").exists() and (folder / "adapter_config.json").is_file()
    loaded = load_adapter(str(folder))
    assert loaded.family == family and not hasattr(loaded.model, "peft_config")  # one plain model
    with torch.no_grad():
        got, _ = loaded.answer_logps(SAMPLES, ["a red cup"])
        plain, _ = load_adapter(str(base)).answer_logps(SAMPLES, ["a red cup"])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (plain - want).abs().max() > 1e-3  # the adapter changes the model


def test_the_base_may_be_relative_to_the_adapter_and_the_processor_comes_from_it(tmp_path):
    base = build_family("qwen2_vl", tmp_path / "models/base")
    folder, want = _trained_adapter(base, tmp_path / "runs/lora", processor=True)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "../../models/base"
    (folder / "adapter_config.json").write_text(json.dumps(config))
    saved = json.loads((folder / "processor_config.json").read_text())
    saved["image_processor"]["size"] = {"shortest_edge": 64, "longest_edge": 1024 + 16}  # the adapter's own
    (folder / "processor_config.json").write_text(json.dumps(saved))
    loaded = load_adapter(str(folder))
    assert loaded.processor.image_processor.size["longest_edge"] == 1024 + 16
    with torch.no_grad():
        got, _ = loaded.answer_logps(SAMPLES, ["a red cup"])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_a_base_that_is_not_a_local_folder_is_a_clear_error(tmp_path):
    base = build_family("qwen2_vl", tmp_path / "base")
    folder, _ = _trained_adapter(base, tmp_path / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "Qwen/Qwen2-VL-2B-Instruct"
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="base model 'Qwen/Qwen2-VL-2B-Instruct' is not a local model folder"):
        load_adapter(str(folder))


def test_an_adapter_of_another_base_is_a_clear_error(tmp_path):
    """Idefics3's LM is model.text_model: a LoRA of Qwen2-VL's model.language_model names nothing there, and
    PEFT itself would only warn and leave it out."""
    folder, _ = _trained_adapter(build_family("qwen2_vl", tmp_path / "qwen"), tmp_path / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(build_family("idefics3", tmp_path / "idefics3"))
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="does not fit its base"):
        load_adapter(str(folder))
