"""diffzoo.tasks: LightningModules (image, contrastive image-text, speech and language-model training),
zero-shot and retrieval evaluation, export.

Importing this package imports Lightning; :mod:`diffzoo` itself does not.
"""

from .classification import ImageClassificationTask
from .contrastive import ClipRunSummary, ContrastiveTask
from .export import export_checkpoint, export_module, load_exported, read_metadata, save_safetensors
from .lm import LanguageModelTask, LMRunSummary, export_lm, load_lm
from .optim import adamw_warmup_cosine, warmup_cosine, weight_decay_groups
from .retrieval import attention_scores, evaluate_retrieval
from .speech import SpeechClassificationTask
from .zeroshot import load_clip, load_clip_weights, retrieval_recall, zero_shot_accuracy, zero_shot_classifier

__all__ = [
    "ClipRunSummary",
    "ContrastiveTask",
    "ImageClassificationTask",
    "LMRunSummary",
    "LanguageModelTask",
    "SpeechClassificationTask",
    "adamw_warmup_cosine",
    "attention_scores",
    "evaluate_retrieval",
    "export_checkpoint",
    "export_lm",
    "export_module",
    "load_clip",
    "load_clip_weights",
    "load_exported",
    "load_lm",
    "read_metadata",
    "retrieval_recall",
    "save_safetensors",
    "warmup_cosine",
    "weight_decay_groups",
    "zero_shot_accuracy",
    "zero_shot_classifier",
]
