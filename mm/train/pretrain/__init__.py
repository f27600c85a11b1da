"""CLIP-style contrastive pretraining of a note encoder (vision tower -> fusion -> pooled note) against a
tiny text encoder, with retrieval evaluation on held-out notes (``mm pretrain``).

Model (Radford et al. 2021, CLIP, with a multi-image note side): :mod:`mm.train.pretrain.model`.
Loss: :mod:`mm.contrastive` (CLIP InfoNCE or SigLIP, optional multi-positive over a note's images, label
smoothing, learnable or fixed temperature), plus an optional object-tagging loss. Under torchrun /
accelerate (DDP) the features of every rank are gathered with gradients, so each step's loss equals the
single-process loss on the global batch. The loop is :mod:`mm.train.loop`'s; this package keeps the
config (``config``), model and losses (``model``), data (``data``) and the batch/loss/evaluation
(``trainer``).

Deviations from CLIP: tiny towers trained from scratch; notes pool several images; the data order is a
pure function of (seed, step) (:func:`mm.train.common.batch_indices`) so resume is exact.
"""

from mm.train.pretrain.config import (
    DataConfig,
    LossConfig,
    OptimConfig,
    PretrainConfig,
    PretrainModelConfig,
    RunConfig,
)
from mm.train.pretrain.data import NoteTensors, cell_objects, load_split, object_tags, tag_classes, tag_grid
from mm.train.pretrain.model import NoteTextModel, contrastive_loss, scoped_tag_loss, tag_loss
from mm.train.pretrain.trainer import TrainResult, embed_split, evaluate, train, write_plots

__all__ = [
    "DataConfig", "LossConfig", "NoteTensors", "NoteTextModel", "OptimConfig", "PretrainConfig",
    "PretrainModelConfig", "RunConfig", "TrainResult", "cell_objects", "contrastive_loss", "embed_split",
    "evaluate", "load_split", "object_tags", "scoped_tag_loss", "tag_classes", "tag_grid", "tag_loss",
    "train", "write_plots",
]  # fmt: skip
