"""diffzoo.layers: the public building blocks of differential-attention transformers.

    from diffzoo.layers import DiffAttention, Block, Transformer
"""

from .attention import Attention, AttentionBase
from .block import Block, DropPath, LayerScale, build_attention, diff_heads_for_baseline
from .diff_attention import DiffAttention, DiffAttentionV2, combine_v1, combine_v2
from .heads import resolve_heads
from .kv_cache import KVCache
from .matched import MatchedPair, check_matched, count_parameters, matched_attention_pair
from .mlp import Mlp, SwiGLU
from .norm import RMSNorm, build_norm
from .rope import RotaryEmbedding
from .spec import VARIANTS, AttnSpec, get_spec, lambda_init_schedule, spec_names
from .transformer import GradCheckpointingMixin, Transformer, drop_path_rates, take_indices

__all__ = [
    "Attention",
    "AttentionBase",
    "AttnSpec",
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
    "VARIANTS",
    "build_attention",
    "build_norm",
    "check_matched",
    "combine_v1",
    "combine_v2",
    "count_parameters",
    "diff_heads_for_baseline",
    "drop_path_rates",
    "get_spec",
    "lambda_init_schedule",
    "matched_attention_pair",
    "resolve_heads",
    "spec_names",
    "take_indices",
]
