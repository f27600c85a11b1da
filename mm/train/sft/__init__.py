"""NoteVLM align / SFT: the LLaVA two-stage recipe (Liu et al., 2023, "Visual Instruction Tuning") on notes.

Stage ``align`` trains the fusion module only (vision tower + LM frozen) on captions; stage ``sft`` trains
fusion + LM (full, or LoRA adapters on the LM's linear layers with the fusion trained whole; Hu et al.,
2021) on captions and yes/no questions. Loss: next-token cross-entropy on the answer tokens only.

Deviations from LLaVA: a note has 1-4 images; tiny models from scratch (the LM is random-init unless
``init.model`` names a trained NoteVLM); ``align`` starts the vision tower + fusion from an InfoNCE
checkpoint (:mod:`mm.train.init_from_pretrain`) instead of CLIP; data order is a pure function of
``(seed, step)`` so a resumed run ends with the same weights as an uninterrupted one.

Evaluation on held-out notes: teacher-forced caption loss; greedy captions (batched, KV cache) scored with
CHAIR on the world vocabulary (:mod:`mm.train.caption_eval`); yes/no accuracy when questions are trained.

The loop is :mod:`mm.train.loop`'s; this package keeps the config (``config``), the model set-up
(``model``), the loss (``loss``), the held-out evaluation (``evaluation``) and the batch (``trainer``).
"""

from mm.train.config import OptimConfig, lr_lambda, param_groups
from mm.train.sft.config import (
    STAGES,
    DataConfig,
    EvalConfig,
    InitConfig,
    LoraConfig,
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
)
from mm.train.sft.evaluation import EvalData, evaluate, load_eval_data
from mm.train.sft.loss import (
    QUESTION_KINDS,
    answer_loss,
    answer_token_divisor,
    mean_answer_tokens,
    sample_weights,
)
from mm.train.sft.model import build_model_and_processor, load_tokenizer, prepare_trainable, save_final
from mm.train.sft.trainer import SFTTrainer, TrainResult, train, write_plots

__all__ = [
    "QUESTION_KINDS", "STAGES", "DataConfig", "EvalConfig", "EvalData", "InitConfig", "LoraConfig",
    "ModelConfig", "OptimConfig", "RunConfig", "SFTTrainer", "TaskConfig", "TrainConfig", "TrainResult",
    "answer_loss", "answer_token_divisor", "build_model_and_processor", "evaluate", "load_eval_data",
    "load_tokenizer", "lr_lambda", "mean_answer_tokens", "param_groups", "prepare_trainable",
    "sample_weights", "save_final", "train", "write_plots",
]  # fmt: skip
