"""diffzoo.tasks: LightningModules (image classification) and weight export.

Importing this package imports Lightning; :mod:`diffzoo` itself does not.
"""

from .classification import ImageClassificationTask, warmup_cosine
from .export import export_checkpoint, export_module, load_exported, read_metadata, save_safetensors

__all__ = [
    "ImageClassificationTask",
    "export_checkpoint",
    "export_module",
    "load_exported",
    "read_metadata",
    "save_safetensors",
    "warmup_cosine",
]
