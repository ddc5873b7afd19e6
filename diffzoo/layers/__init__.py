"""diffzoo.layers: the public building blocks of differential-attention transformers.

    from diffzoo.layers import DiffAttention, Block, Transformer
"""

from .attention import Attention, AttentionBase
from .block import Block, DropPath, LayerScale, build_attention, diff_heads_for_baseline
from .diff_attention import DiffAttention, DiffAttentionV2, lambda_init_schedule
from .heads import resolve_heads
from .kv_cache import KVCache
from .matched import MatchedPair, check_matched, count_parameters, matched_attention_pair
from .mlp import Mlp, SwiGLU
from .norm import RMSNorm, build_norm
from .rope import RotaryEmbedding
from .transformer import GradCheckpointingMixin, Transformer, drop_path_rates, take_indices

__all__ = [
    "Attention",
    "AttentionBase",
    "Block",
    "DiffAttention",
    "DiffAttentionV2",
    "DropPath",
    "GradCheckpointingMixin",
    "KVCache",
    "LayerScale",
    "MatchedPair",
    "Mlp",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLU",
    "Transformer",
    "build_attention",
    "build_norm",
    "check_matched",
    "count_parameters",
    "diff_heads_for_baseline",
    "drop_path_rates",
    "lambda_init_schedule",
    "matched_attention_pair",
    "resolve_heads",
    "take_indices",
]
