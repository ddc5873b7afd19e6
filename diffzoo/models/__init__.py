"""diffzoo.models: model families composed from :mod:`diffzoo.layers`, registered with timm.

Importing this package registers the ``diffvit_*`` / ``softvit_*`` models in timm's registry.
"""

from .vit import VIT_CONFIGS, VisionTransformer, checkpoint_filter_fn, matched_name, model_names

__all__ = ["VIT_CONFIGS", "VisionTransformer", "checkpoint_filter_fn", "matched_name", "model_names"]
