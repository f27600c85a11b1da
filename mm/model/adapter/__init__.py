"""One model interface over NoteVLM and any transformers image-text-to-text model (``docs/byo.md``).

    from mm.model.adapter import Sample, load_adapter

    adapter = load_adapter(folder, device="cuda", dtype="bfloat16")
    samples = [Sample(images=[img], text="Describe the image.")]
    texts = adapter.generate(samples, max_new_tokens=32)
    logps, mask = adapter.answer_logps(samples, ["A red cup."])     # (B, T), (B, T)
    adapter.apply_lora(r=8, alpha=16)
    adapter.merge_and_save("out/model")

Files: ``base.py`` (the interface and the shared logic), ``batching.py`` (pure tensor helpers),
``family.py`` (per-family facts as data), ``hf.py`` / ``notevlm.py`` (the implementations),
``load.py`` (folder or model -> adapter).
"""

from mm.model.adapter.base import Generation, Sample, VLMAdapter
from mm.model.adapter.family import FAMILIES, FamilySpec
from mm.model.adapter.load import load_adapter

__all__ = ["FAMILIES", "FamilySpec", "Generation", "Sample", "VLMAdapter", "load_adapter"]
