"""mm: a small vision-language model for image-text notes: data, model, training, evaluation.

Data flows one way: data -> model -> losses -> training -> evaluation.

- :mod:`mm.world`: the built-in synthetic note world (vocabulary, scenes, rendering, captions,
  questions); it writes notes in the one on-disk format.
- :mod:`mm.data`: the note format (``notes.jsonl`` + images), readers for COCO / LLaVA / POPE files,
  dataset and collate, the project's tokenizer.
- :mod:`mm.vision`: vision towers (open_clip, loaded lazily; transformers CLIP / SigLIP), pretrained
  loading.
- :mod:`mm.fusion`: image patches -> a fixed number of LM tokens per image (mlp, qformer, resampler),
  behind ``build_fusion``.
- :mod:`mm.multi_image`: image index embeddings, pooled note embeddings, text -> image visibility masks.
- :mod:`mm.contrastive`: CLIP / SigLIP contrastive losses (pure functions).
- :mod:`mm.model`: NoteVLM (configuration, modeling, processing, registered with transformers' Auto
  classes), the factory that builds it from a config, LoRA presets.
- :mod:`mm.train`: the training skeleton, pretraining (contrastive + captioning), SFT, sample builders.
- :mod:`mm.eval`: POPE and CHAIR metrics, their file readers, hallucination causes, runners that
  evaluate a model on notes, the ``mm eval`` CLI.
- :mod:`mm.config` (typed dataclass configs from YAML; unknown keys are errors), :mod:`mm.errors`
  (errors a user can fix), :mod:`mm.dispatch` and :mod:`mm.cli` (the ``mm`` command line).

Import rule: ``mm`` never imports ``rl`` (``rl`` builds on ``mm``), and ``import mm`` imports nothing
(open_clip, torchvision and matplotlib load only where they are used). ``tests/test_layout.py`` checks
these rules and that the modules import each other without cycles.
"""
