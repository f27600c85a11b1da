"""Test-wide environment: offline hub, writable Numba cache, CPU only, few threads."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "notelens-numba-cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("WANDB_DISABLED", "true")
# Tiny models: one intra-op thread is fastest and never spin-waits on a busy machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
