"""diffzoo.tasks: training code. LightningModules (image, contrastive image-text, speech and language-model
training), their callbacks, optimisers and training metrics.

Importing this package imports Lightning; :mod:`diffzoo` itself does not. Loading and exporting weights
live in :mod:`diffzoo.weights`, zero-shot and retrieval evaluation in :mod:`diffzoo.evaluation`: neither
needs Lightning.
"""

from .classification import ImageClassificationTask
from .contrastive import ClipRunSummary, ContrastiveTask
from .lm import LanguageModelTask, LMRunSummary
from .optim import adamw_warmup_cosine, warmup_cosine, weight_decay_groups
from .speech import SpeechClassificationTask

__all__ = [
    "ClipRunSummary",
    "ContrastiveTask",
    "ImageClassificationTask",
    "LMRunSummary",
    "LanguageModelTask",
    "SpeechClassificationTask",
    "adamw_warmup_cosine",
    "warmup_cosine",
    "weight_decay_groups",
]
