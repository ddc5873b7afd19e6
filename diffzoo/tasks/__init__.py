"""diffzoo.tasks: LightningModules (image, speech and language-model training), retrieval evaluation, export.

Importing this package imports Lightning; :mod:`diffzoo` itself does not.
"""

from .classification import ImageClassificationTask, warmup_cosine
from .export import export_checkpoint, export_module, load_exported, read_metadata, save_safetensors
from .lm import LanguageModelTask, LMRunSummary, export_lm, load_lm
from .retrieval import attention_scores, evaluate_retrieval
from .speech import SpeechClassificationTask

__all__ = [
    "ImageClassificationTask",
    "LMRunSummary",
    "LanguageModelTask",
    "SpeechClassificationTask",
    "attention_scores",
    "evaluate_retrieval",
    "export_checkpoint",
    "export_lm",
    "export_module",
    "load_exported",
    "load_lm",
    "read_metadata",
    "save_safetensors",
    "warmup_cosine",
]
