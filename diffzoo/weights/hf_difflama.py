"""Convert between :class:`diffzoo.models.lm.CausalLM` and Hugging Face transformers' ``DiffLlamaForCausalLM``.

transformers' DiffLlama (``models/diffllama/modeling_diffllama.py``) lays out the same computation
differently from the official code and from diffzoo:

* **Head pairing.** It runs ``num_attention_heads`` (``NH``) ordinary heads of width ``d`` and pairs
  head ``i`` with head ``i + NH/2`` (first half of the heads = q1, second half = q2); diffzoo pairs
  adjacent heads ``(2i, 2i+1)``. Keys follow the same half split over ``NKV`` heads.
* **Values.** It splits the ``NKV`` value heads into halves and concatenates head ``g`` with head
  ``g + NKV/2`` into the width-``2d`` value of group ``g``; diffzoo's value head ``g`` is one slice of
  width ``2d``. Both are a fixed permutation of the projection rows, the same one as for q and k.
* **Per-head norm.** ``nn.RMSNorm(2d, elementwise_affine=False)`` with ``rms_norm_eps``; diffzoo's has a
  learnable weight, which the conversion to transformers folds into the output projection's columns
  (exact, because the output projection is linear).

Everything else (lambda re-parameterisation, ``lambda_init`` schedule over the 0-based layer index,
rotate-half RoPE, SwiGLU, RMSNorms, tied embeddings) maps one to one. transformers is imported only
inside the functions: it is an optional (``dev``) dependency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..models.lm import CausalLM, LMConfig

if TYPE_CHECKING:  # pragma: no cover
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

__all__ = [
    "config_from_hf",
    "config_to_hf",
    "from_hf_difflama",
    "hf_state_dict_to_diffzoo",
    "diffzoo_state_dict_to_hf",
    "to_hf_difflama",
]


def _halves_to_pairs(w: Tensor, pairs: int, d: int) -> Tensor:
    """Rows ordered ``[first half heads | second half heads]`` -> ``[(h0, h0'), (h1, h1'), ...]``."""
    return w.reshape(2, pairs, d, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def _pairs_to_halves(w: Tensor, pairs: int, d: int) -> Tensor:
    """Inverse of :func:`_halves_to_pairs`."""
    return w.reshape(pairs, 2, d, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def config_from_hf(hf_config: DiffLlamaConfig, **overrides: Any) -> LMConfig:
    """The :class:`LMConfig` of a transformers ``DiffLlamaConfig`` (raises for what diffzoo cannot express)."""
    c = hf_config
    if c.head_dim != c.hidden_size // c.num_attention_heads:
        raise ValueError(
            f"head_dim={c.head_dim} differs from hidden_size / num_attention_heads = "
            f"{c.hidden_size // c.num_attention_heads}; diffzoo derives the head width from the model width"
        )
    if c.hidden_act != "silu":
        raise ValueError(f"hidden_act={c.hidden_act!r}: diffzoo's SwiGLU uses silu")
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type={rope['rope_type']!r}: only the default (unscaled) RoPE is supported")
    theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    kwargs = dict(
        vocab_size=c.vocab_size, dim=c.hidden_size, depth=c.num_hidden_layers, baseline_heads=c.num_attention_heads,
        baseline_kv_heads=c.num_key_value_heads, attn="diff", intermediate_size=c.intermediate_size,
        rope_base=float(theta), norm_eps=c.rms_norm_eps, tie_embeddings=bool(c.tie_word_embeddings),
        bias=bool(c.attention_bias), max_seq_len=c.max_position_embeddings,
    )
    kwargs.update(overrides)
    return LMConfig(**kwargs)


def config_to_hf(config: LMConfig, **overrides: Any) -> DiffLlamaConfig:
    """A transformers ``DiffLlamaConfig`` for a differential (V1) :class:`LMConfig`."""
    from transformers import DiffLlamaConfig

    if config.attn != "diff":
        raise ValueError(f"DiffLlama holds differential attention V1; this config has attn={config.attn!r}")
    if config.lambda_init is not None:
        raise ValueError("DiffLlama always uses the depth schedule of lambda_init; this config fixes it")
    kwargs = dict(
        vocab_size=config.vocab_size, hidden_size=config.dim, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.depth, num_attention_heads=config.baseline_heads,
        num_key_value_heads=config.baseline_kv_heads, hidden_act="silu", max_position_embeddings=config.max_seq_len,
        rms_norm_eps=config.norm_eps, tie_word_embeddings=config.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_base},
        attention_bias=config.bias, attention_dropout=0.0, pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )
    kwargs.update(overrides)
    return DiffLlamaConfig(**kwargs)


def hf_state_dict_to_diffzoo(sd: dict[str, Tensor], config: LMConfig) -> dict[str, Tensor]:
    """Rename and permute a ``DiffLlamaForCausalLM`` state dict into :class:`CausalLM`'s."""
    H, Hkv, d = config.baseline_heads // 2, config.baseline_kv_heads // 2, config.head_dim
    out: dict[str, Tensor] = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    out["output.weight"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    for i in range(config.depth):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        a = src + "self_attn."
        for kind in ("weight", "bias") if config.bias else ("weight",):
            out[dst + f"attn.q_proj.{kind}"] = _halves_to_pairs(sd[a + f"q_proj.{kind}"], H, d)
            out[dst + f"attn.k_proj.{kind}"] = _halves_to_pairs(sd[a + f"k_proj.{kind}"], Hkv, d)
            out[dst + f"attn.v_proj.{kind}"] = _halves_to_pairs(sd[a + f"v_proj.{kind}"], Hkv, d)
            out[dst + f"attn.out_proj.{kind}"] = sd[a + f"o_proj.{kind}"]
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            out[dst + f"attn.{name}"] = sd[a + name]
        out[dst + "attn.sub_norm.weight"] = torch.ones(2 * d, dtype=sd[a + "lambda_q1"].dtype)
        out[dst + "norm1.weight"] = sd[src + "input_layernorm.weight"]
        out[dst + "norm2.weight"] = sd[src + "post_attention_layernorm.weight"]
        out[dst + "mlp.w1.weight"] = sd[src + "mlp.gate_proj.weight"]
        out[dst + "mlp.w3.weight"] = sd[src + "mlp.up_proj.weight"]
        out[dst + "mlp.w2.weight"] = sd[src + "mlp.down_proj.weight"]
    return out


def diffzoo_state_dict_to_hf(sd: dict[str, Tensor], config: LMConfig) -> dict[str, Tensor]:
    """Rename and permute a :class:`CausalLM` state dict into ``DiffLlamaForCausalLM``'s."""
    H, Hkv, d = config.baseline_heads // 2, config.baseline_kv_heads // 2, config.head_dim
    out: dict[str, Tensor] = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"]}
    out["lm_head.weight"] = sd["output.weight"]
    for i in range(config.depth):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        a = dst + "self_attn."
        for kind in ("weight", "bias") if config.bias else ("weight",):
            out[a + f"q_proj.{kind}"] = _pairs_to_halves(sd[src + f"attn.q_proj.{kind}"], H, d)
            out[a + f"k_proj.{kind}"] = _pairs_to_halves(sd[src + f"attn.k_proj.{kind}"], Hkv, d)
            out[a + f"v_proj.{kind}"] = _pairs_to_halves(sd[src + f"attn.v_proj.{kind}"], Hkv, d)
        # transformers' per-head norm has no weight: fold diffzoo's into the output projection's input columns.
        w = sd[src + "attn.sub_norm.weight"]
        out[a + "o_proj.weight"] = sd[src + "attn.out_proj.weight"] * w.repeat(H)[None, :]
        if config.bias:
            out[a + "o_proj.bias"] = sd[src + "attn.out_proj.bias"]
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            out[a + name] = sd[src + f"attn.{name}"]
        out[dst + "input_layernorm.weight"] = sd[src + "norm1.weight"]
        out[dst + "post_attention_layernorm.weight"] = sd[src + "norm2.weight"]
        out[dst + "mlp.gate_proj.weight"] = sd[src + "mlp.w1.weight"]
        out[dst + "mlp.up_proj.weight"] = sd[src + "mlp.w3.weight"]
        out[dst + "mlp.down_proj.weight"] = sd[src + "mlp.w2.weight"]
    return out


def from_hf_difflama(hf_model: DiffLlamaForCausalLM, **overrides: Any) -> CausalLM:
    """A :class:`CausalLM` with the weights of a transformers ``DiffLlamaForCausalLM`` (same logits)."""
    config = config_from_hf(hf_model.config, **overrides)
    model = CausalLM(config)
    sd = hf_state_dict_to_diffzoo(hf_model.state_dict(), config)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (config.tie_embeddings and k == "output.weight")]
    if missing or unexpected:
        raise ValueError(f"weight conversion mismatch: missing {missing}, unexpected {unexpected}")
    return model.to(hf_model.dtype)


def to_hf_difflama(model: CausalLM, **config_overrides: Any) -> DiffLlamaForCausalLM:
    """A transformers ``DiffLlamaForCausalLM`` computing the same logits as ``model`` (attn ``"diff"``)."""
    from transformers import DiffLlamaForCausalLM

    hf_config = config_to_hf(model.config, **config_overrides)
    hf_model = DiffLlamaForCausalLM(hf_config)
    sd = diffzoo_state_dict_to_hf(model.state_dict(), model.config)
    if model.config.tie_embeddings:
        sd.pop("lm_head.weight")
    missing, unexpected = hf_model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (model.config.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weight conversion mismatch: missing {missing}, unexpected {unexpected}")
    return hf_model.to(model.output.weight.dtype)
