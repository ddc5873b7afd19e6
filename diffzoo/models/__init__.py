"""diffzoo.models: model families composed from :mod:`diffzoo.layers`, registered with timm.

Importing this package registers the ViT (``diffvit_*`` / ``softvit_*``: timm's ``VisionTransformer``
with diffzoo attention through ``attn_layer=``, see :mod:`diffzoo.models.vit`) and speech (``diffkwt_*``,
``diffast_*`` and their ``soft*`` baselines) models in timm's registry, and the CLIP family
(``DiffCLIP-ViT-B-16``, ``DiffCLIPstar-*``, ``DiffCLIPdagger-*``, ``SoftCLIP-*``, ``*-nano``) as open_clip
model configs; the causal LM lives in :mod:`diffzoo.models.lm`.
"""

from .clip import DiffTextTower, DiffVisionTower, DiffzooTowerCfg, clip_model_names, create_clip
from .lm import LM_PRESETS, CausalLM, LMConfig, generate, left_pad, matched_lm_pair, sample_next
from .speech import (
    SPEECH_CONFIGS,
    LogMelFrontend,
    SpeechEncoderConfig,
    SpeechFeatures,
    SpeechTransformer,
    matched_speech_name,
    speech_model_names,
)
from .vit import (
    VIT_CONFIGS,
    TimmDiffAttention,
    TimmDiffAttentionV2,
    VisionTransformer,
    checkpoint_filter_fn,
    matched_name,
    model_names,
    vision_transformer,
)

__all__ = [
    "CausalLM",
    "DiffTextTower",
    "DiffVisionTower",
    "DiffzooTowerCfg",
    "LMConfig",
    "LM_PRESETS",
    "LogMelFrontend",
    "SPEECH_CONFIGS",
    "SpeechEncoderConfig",
    "SpeechFeatures",
    "SpeechTransformer",
    "TimmDiffAttention",
    "TimmDiffAttentionV2",
    "VIT_CONFIGS",
    "VisionTransformer",
    "checkpoint_filter_fn",
    "clip_model_names",
    "create_clip",
    "generate",
    "left_pad",
    "matched_lm_pair",
    "matched_name",
    "matched_speech_name",
    "model_names",
    "sample_next",
    "speech_model_names",
    "vision_transformer",
]
