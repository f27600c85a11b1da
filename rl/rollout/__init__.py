"""Rollout engines: sample ``G`` completions per prompt and report the sampling distribution's log-probs.

    engine = build_engine("local", adapter, spec)        # in process (rl.rollout.local)
    engine = build_engine("vllm", adapter, spec)         # vLLM, a CUDA GPU and the `vllm` extra
    comps = engine.generate(samples)                     # Completions: (B*G) rows, prompt-major
    engine.sync()                                        # after an optimizer step (vLLM copies weights)

``Completions.logps`` is None when the engine samples from the trainer's own distribution (in process,
no top-k / top-p): the importance weights are then exactly 1 and no correction is applied
(:mod:`rl.importance`). Files: ``base.py`` (the interface, the registry), ``local.py``, ``vllm.py``,
``recorder.py`` (sampling log-probs out of HF ``generate``).
"""

from rl.rollout.base import ENGINES, Completions, RolloutEngine, SamplingSpec, build_engine

__all__ = ["ENGINES", "Completions", "RolloutEngine", "SamplingSpec", "build_engine"]
