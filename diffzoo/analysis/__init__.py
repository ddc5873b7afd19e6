"""diffzoo.analysis: the paper's attention-noise measurements for any model built from diffzoo.layers.

Ye et al., "Differential Transformer", ICLR 2025 (arXiv 2410.05258), Sections 3.4 and 3.7; the
definitions are in docs/design.md ("Attention noise", "Activation outliers", "Low-bit attention").
Nothing here changes a model: recorders wrap the attention layers only inside a ``with``.

* :mod:`.maps` - :func:`record_attention` (attn1, attn2, attn1 - lam attn2, softmax maps, lambda per
  layer), answer share / entropy / negative share (:func:`attention_noise`) and the relevant tokens of
  images, speech and needle texts.
* :mod:`.outliers` - :func:`record_outliers`: top-1 / top-10 logits and hidden states against the median.
* :mod:`.lowbit` - :func:`low_bit_attention` (absmax 8/6/4-bit attention logits) and :func:`metric_vs_bits`.
* :mod:`.plots` - matplotlib figures of all of the above (``pip install matplotlib``).
"""

from .lowbit import absmax_quantize, attention_logits, low_bit_attention, metric_vs_bits
from .maps import (
    AttentionNoise,
    AttentionRecord,
    LayerAttention,
    answer_share,
    attention_entropy,
    attention_layers,
    attention_noise,
    class_token_query,
    effective_map,
    image_relevant_tokens,
    needle_relevance,
    negative_share,
    record_attention,
    speech_relevance,
    speech_relevant_tokens,
    token_attention,
    vit_relevance,
)
from .outliers import OutlierRecord, OutlierStats, outlier_stats, record_outliers

__all__ = [
    "AttentionNoise",
    "AttentionRecord",
    "LayerAttention",
    "OutlierRecord",
    "OutlierStats",
    "absmax_quantize",
    "answer_share",
    "attention_entropy",
    "attention_layers",
    "attention_logits",
    "attention_noise",
    "class_token_query",
    "effective_map",
    "image_relevant_tokens",
    "low_bit_attention",
    "metric_vs_bits",
    "needle_relevance",
    "negative_share",
    "outlier_stats",
    "record_attention",
    "record_outliers",
    "speech_relevance",
    "speech_relevant_tokens",
    "token_attention",
    "vit_relevance",
]
