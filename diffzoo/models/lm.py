"""A LLaMA-style causal language model with differential or softmax attention.

The paper's own setting (Ye et al., "Differential Transformer", ICLR 2025, arXiv 2410.05258): a decoder
of pre-RMSNorm blocks with SwiGLU feed-forwards, rotary positions, no biases, grouped-query attention
and tied or untied embeddings. One config field, ``attn``, picks differential attention V1
(``"diff"``), V2 (``"diff_v2"``) or the matched softmax baseline (``"softmax"``); head counts are
always those of the softmax baseline (see :func:`diffzoo.layers.build_attention`), so ``"diff"`` and
``"softmax"`` have the same projections and differ by ``6d`` parameters per layer (the lambdas and the
per-head norm weight).

    from diffzoo.models.lm import CausalLM, generate

    model = CausalLM.from_preset("lm_nano", attn="diff")      # 256 byte tokens, 4 blocks of width 128
    logits = model(tokens)                                     # (B, N, vocab)
    out = generate(model, [[72, 105], [87]], max_new_tokens=8) # left-padded batch, kv-cache
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import (
    GradCheckpointingMixin,
    KVCache,
    RMSNorm,
    RotaryEmbedding,
    Transformer,
    check_matched,
    count_parameters,
    resolve_heads,
)
from ..layers.spec import AttnSpec, get_spec
from ..layers.variants import matched_width
from ._renamed import accept_former_names, current_names

__all__ = [
    "LM_PRESETS",
    "LM_RENAMED",
    "CausalLM",
    "LMConfig",
    "generate",
    "left_pad",
    "matched_lm_pair",
    "positions_from_padding",
    "preset_args",
    "sample_next",
]


LM_RENAMED = {"num_heads": "baseline_heads", "num_kv_heads": "baseline_kv_heads"}  # former name -> field


@accept_former_names(LM_RENAMED)
@dataclass
class LMConfig:
    """Architecture of :class:`CausalLM` (litgpt-style: one typed config, named presets below)."""

    vocab_size: int = 256  # byte-level by default (no tokenizer download)
    dim: int = 128  # model width D
    depth: int = 4  # number of blocks
    # Head counts are always the softmax baseline's (one name across diffzoo's model configs); an
    # attention layer's own ``num_heads`` is what it runs: baseline_heads / 2 for "diff", baseline_heads
    # output heads for "diff_v2" and the softmax baseline.
    baseline_heads: int = 4  # heads of the softmax baseline; "diff" uses baseline_heads / 2 heads of two q/k pairs
    baseline_kv_heads: int | None = None  # baseline key/value heads (GQA); None = baseline_heads
    # The attention spec's name (diffzoo.layers.spec): "diff" (V1, the paper), "diff_v2", "softmax", or a study
    # variant ("softmax_wide", "diff_nonorm", "diff_const", "diff_v2_matched"); the shape fields stay the
    # softmax baseline's and the model applies the attention spec's head layout and parameter matching to them.
    attn: str | AttnSpec = "diff"
    intermediate_size: int | None = None  # SwiGLU hidden width; None = LLaMA's 8/3 D rounded up to multiple_of
    multiple_of: int = 32  # rounding of the default intermediate size
    rope_base: float = 10000.0  # RoPE theta
    norm_eps: float = 1e-5  # epsilon of every RMSNorm (block, final and the per-head norm of "diff")
    tie_embeddings: bool = True  # output projection shares the token embedding
    lambda_init: float | None = None  # constant lambda_init; None = the depth schedule 0.8 - 0.6 exp(-0.3 l)
    bias: bool = False  # biases on the attention projections (LLaMA: none)
    init_std: float = 0.02  # normal init of linear and embedding weights
    max_seq_len: int = 2048  # default kv-cache length of generate()
    backend: str | None = None  # attention kernel backend (None follows diffzoo.kernels' selection)
    # Former names, still accepted by __init__ and replace() and readable: num_heads -> baseline_heads,
    # num_kv_heads -> baseline_kv_heads (LM_RENAMED).

    def __post_init__(self) -> None:
        spec = self.spec  # one-line error for an unknown name or a lambda_init the kind cannot take
        if self.baseline_kv_heads is None:
            self.baseline_kv_heads = self.baseline_heads
        for name in ("vocab_size", "dim", "depth", "baseline_heads", "baseline_kv_heads", "multiple_of", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        resolve_heads(self.dim, self.baseline_heads, self.baseline_kv_heads)
        heads, kv_heads = self.heads
        resolve_heads(self.dim, heads, kv_heads)
        if spec.kind == "diff" and (heads % 2 or kv_heads % 2):
            raise ValueError(
                f"attn={spec.name!r} pairs the baseline's heads: baseline_heads={heads} and "
                f"baseline_kv_heads={kv_heads} must both be even"
            )
        if self.head_dim % 2:
            raise ValueError(f"head width dim / heads = {self.head_dim} must be even for RoPE")
        if self.intermediate_size is None:
            hidden = int(8 * self.dim / 3)
            self.intermediate_size = self.multiple_of * math.ceil(hidden / self.multiple_of)

    @property
    def spec(self) -> AttnSpec:
        """The attention spec named by ``attn`` (with ``lambda_init``, when set, as its constant)."""
        return get_spec(self.attn, self.lambda_init)

    @property
    def heads(self) -> tuple[int, int]:
        """``(heads, kv_heads)`` the softmax-shaped projections are laid out in: the baseline's, times the
        spec's ``head_scale``."""
        spec = self.spec
        kv = self.baseline_heads if self.baseline_kv_heads is None else self.baseline_kv_heads
        return spec.scale_heads(self.baseline_heads, "baseline_heads"), spec.scale_heads(kv, "baseline_kv_heads")

    @property
    def head_dim(self) -> int:
        """Query/key width ``d`` of every head (the baseline's ``dim / baseline_heads``, wider when the attention spec
        runs fewer heads)."""
        return self.dim // self.heads[0]

    def replace(self, **changes: Any) -> LMConfig:
        """A copy with some fields changed (validated again); former field names are accepted."""
        return dataclasses.replace(self, **current_names(changes, LM_RENAMED))


# Named presets. The first three train on 2 CPU cores; lm_paper_3b is the paper's 3B shape (Table 6).
LM_PRESETS: dict[str, dict[str, Any]] = {
    "lm_tiny": dict(dim=64, depth=2, baseline_heads=4, intermediate_size=160),  # tests: ~0.11 M parameters
    "lm_nano": dict(dim=128, depth=4, baseline_heads=4),  # the CPU recipe: ~0.84 M parameters
    "lm_micro": dict(dim=256, depth=6, baseline_heads=8, baseline_kv_heads=4),  # ~4.5 M, GQA
    "lm_small": dict(dim=768, depth=12, baseline_heads=12, baseline_kv_heads=4, vocab_size=32000),  # GPT-2-small size
    "lm_paper_3b": dict(
        dim=3072, depth=28, baseline_heads=24, baseline_kv_heads=24, intermediate_size=8192, vocab_size=100288,
        tie_embeddings=False, max_seq_len=4096,
    ),
}


def preset_args(name: str, **overrides: Any) -> dict[str, Any]:
    """:class:`LMConfig` arguments of the preset ``name`` with ``overrides`` (former field names accepted)."""
    if name not in LM_PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(LM_PRESETS)}")
    return {**LM_PRESETS[name], **current_names(overrides, LM_RENAMED)}


def positions_from_padding(key_padding_mask: Tensor, num_new: int) -> Tensor:
    """RoPE positions of the last ``num_new`` tokens: each sequence counts only its unpadded tokens.

    Args:
        key_padding_mask: bool ``(B, Nk)``, True marks padding (left padding in batched generation).
        num_new: tokens being fed now (the last ``num_new`` columns).

    Returns:
        ``(B, num_new)`` int64 positions; padded slots get position 0 (they are masked anyway).
    """
    pos = (~key_padding_mask).long().cumsum(-1) - 1
    return pos.clamp(min=0)[:, -num_new:]


class CausalLM(GradCheckpointingMixin, nn.Module):
    """Decoder-only LM: token embedding, ``depth`` pre-RMSNorm blocks, final RMSNorm, output projection.

    Args:
        config: an :class:`LMConfig` (or use :meth:`from_preset`).
    """

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = cfg = config
        self.spec = spec = cfg.spec
        #: the SwiGLU width built: the config's, or the parameter-matched one of a ``match_params`` spec
        self.intermediate_size = matched_intermediate_size(cfg) if spec.match_params else cfg.intermediate_size
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        rope = RotaryEmbedding(cfg.head_dim, base=cfg.rope_base)  # no parameters: shared by every block
        self.blocks = Transformer(
            cfg.dim, cfg.depth, cfg.baseline_heads, attn=spec, num_kv_heads=cfg.baseline_kv_heads,
            mlp_hidden_dim=self.intermediate_size, mlp="swiglu", norm="rmsnorm",
            qkv_bias=cfg.bias, proj_bias=cfg.bias, mlp_bias=False, causal=True, rope=rope, norm_eps=cfg.norm_eps,
            sub_norm_eps=cfg.norm_eps, backend=cfg.backend,
        )
        self.norm = RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> CausalLM:
        """Build a named preset (``LM_PRESETS``), e.g. ``CausalLM.from_preset("lm_nano", attn="softmax")``."""
        return cls(LMConfig(**preset_args(name, **overrides)))

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights; residual output projections scaled by ``1/sqrt(2 depth)`` (GPT-2)."""
        std = self.config.init_std
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                scale = 1 / math.sqrt(2 * self.config.depth) if name.endswith(("out_proj", "mlp.w2")) else 1.0
                nn.init.normal_(module.weight, mean=0.0, std=std * scale)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameter names that AdamW should not decay (embeddings; 1-d parameters are skipped anyway)."""
        return {"tok_embeddings.weight", "output.weight"} if self.config.tie_embeddings else {"tok_embeddings.weight"}

    def make_kv_caches(
        self, batch_size: int, max_seq_len: int | None = None, dtype: torch.dtype | None = None
    ) -> list[KVCache]:
        """One empty :class:`KVCache` per block for incremental decoding.

        ``dtype=None`` stores keys/values in the activations' dtype (bf16 under ``torch.autocast``).
        """
        return self.blocks.make_kv_caches(batch_size, max_seq_len or self.config.max_seq_len, dtype=dtype)

    def forward(
        self,
        tokens: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        positions: Tensor | None = None,
        kv_caches: Sequence[KVCache] | None = None,
    ) -> Tensor:
        """Next-token logits ``(B, N, vocab_size)`` (fp32 or the parameter dtype).

        Args:
            tokens: int ``(B, N)``.
            key_padding_mask: bool ``(B, Nk)``, True marks padding; with ``kv_caches`` it covers every
                cached token plus the ``N`` new ones. Positions then count unpadded tokens only, so a
                left-padded sequence gets the positions it would have alone.
            positions: explicit RoPE positions ``(N,)`` or ``(B, N)`` (default: from the padding, else
                continuing the cache, else ``0..N-1``).
            kv_caches: from :meth:`make_kv_caches`, updated in place.

        Attention maps come from :func:`diffzoo.analysis.record_attention` around this call.
        """
        x, positions = self._embed(tokens, key_padding_mask, positions)
        x = self.blocks(x, key_padding_mask=key_padding_mask, positions=positions, kv_caches=kv_caches)
        return self.output(self.norm(x))  # (B, N, vocab)

    def forward_intermediates(
        self,
        tokens: Tensor,
        indices: int | list[int] | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        positions: Tensor | None = None,
        norm: bool = False,
        stop_early: bool = False,
    ) -> list[Tensor]:
        """Hidden states ``(B, N, dim)`` after the selected blocks (None: all; ``n``: the last ``n``).

        ``norm=True`` applies the final RMSNorm to each; ``stop_early`` skips the blocks after the last
        selected one.
        """
        x, positions = self._embed(tokens, key_padding_mask, positions)
        _, out = self.blocks.forward_intermediates(
            x, indices, stop_early=stop_early, key_padding_mask=key_padding_mask, positions=positions
        )
        return [self.norm(t) for t in out] if norm else out

    def _embed(self, tokens: Tensor, key_padding_mask: Tensor | None,
               positions: Tensor | None) -> tuple[Tensor, Tensor | None]:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, length) integers, got shape {tuple(tokens.shape)}")
        if positions is None and key_padding_mask is not None:
            positions = positions_from_padding(key_padding_mask, tokens.shape[1])
        return self.tok_embeddings(tokens), positions  # (B, N, D)


def matched_intermediate_size(config: LMConfig) -> int:
    """The SwiGLU width at which ``config``'s model has the parameter count of its softmax model (``config``'s
    ``intermediate_size`` is the softmax model's)."""
    spec = config.spec
    target = count_parameters(CausalLM(config.replace(attn="softmax", lambda_init=None)))
    unmatched = dataclasses.replace(spec, match_params=False)
    return matched_width(lambda w: CausalLM(config.replace(attn=unmatched, intermediate_size=w)),
                         config.intermediate_size, target)


def matched_lm_pair(config: LMConfig) -> tuple[CausalLM, CausalLM]:
    """A softmax and a differential (V1) :class:`CausalLM` of the same shape; raises unless within 0.5 %."""
    softmax, diff = CausalLM(config.replace(attn="softmax")), CausalLM(config.replace(attn="diff"))
    check_matched(softmax, diff)
    return softmax, diff


# -- generation ------------------------------------------------------------------------------------
def left_pad(sequences: Sequence[Sequence[int]], pad_id: int = 0, device: Any = None) -> tuple[Tensor, Tensor]:
    """Stack token lists to the right edge: ``(tokens (B, P), padding (B, P))``, padding True on the left."""
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("every prompt needs at least one token")
    P = max(len(s) for s in sequences)
    tokens = torch.full((len(sequences), P), pad_id, dtype=torch.long, device=device)
    padding = torch.ones(len(sequences), P, dtype=torch.bool, device=device)
    for i, s in enumerate(sequences):
        tokens[i, P - len(s):] = torch.as_tensor(list(s), dtype=torch.long, device=device)
        padding[i, P - len(s):] = False
    return tokens, padding


def sample_next(
    logits: Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token per row of ``logits (B, V)``: greedy at ``temperature=0``, else sampled.

    ``top_k`` keeps the k most likely tokens, ``top_p`` the smallest set whose probability reaches p
    (nucleus sampling; the most likely token is always kept). Returns int64 ``(B,)``.
    """
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # mass before this token already reaches p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: CausalLM,
    prompts: Sequence[Sequence[int]] | Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    pad_id: int = 0,
    prompt_padding: Tensor | None = None,
    generator: torch.Generator | None = None,
    return_logits: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Continue a batch of prompts with the kv-cache.

    Args:
        model: the language model (put it in ``eval()`` mode yourself).
        prompts: token lists of any lengths (left-padded here), or a left-padded ``(B, P)`` tensor with
            ``prompt_padding`` (bool, True = padding).
        max_new_tokens: tokens to generate per sequence.
        temperature, top_k, top_p: see :func:`sample_next` (``temperature=0`` is greedy).
        eos_id: a sequence that emits it keeps emitting ``eos_id``; stops early when all have.
        pad_id: token id written into the left padding.
        generator: random generator for sampling.
        return_logits: also return the logits each new token was chosen from, ``(B, T, V)``.

    Returns:
        int64 ``(B, T)`` new tokens (``T <= max_new_tokens``), or ``(tokens, logits)``.
    """
    device = model.output.weight.device
    if isinstance(prompts, Tensor):
        tokens = prompts.to(device)
        padding = torch.zeros_like(tokens, dtype=torch.bool) if prompt_padding is None else prompt_padding.to(device)
        if padding[:, -1].any():
            raise ValueError("prompt tensors must be left-padded: the last column must hold real tokens")
    else:
        tokens, padding = left_pad(prompts, pad_id, device)
    B, P = tokens.shape
    caches = model.make_kv_caches(B, P + max_new_tokens)
    logits = model(tokens, key_padding_mask=padding, kv_caches=caches)[:, -1]  # (B, V)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    new, scores = [], []
    for step in range(max_new_tokens):
        scores.append(logits)
        nxt = sample_next(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            nxt = nxt.masked_fill(done, eos_id)
            done |= nxt == eos_id
        new.append(nxt)
        if step == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
            break
        padding = F.pad(padding, (0, 1), value=False)
        logits = model(nxt[:, None], key_padding_mask=padding, kv_caches=caches)[:, -1]
    out = torch.stack(new, 1) if new else tokens.new_zeros(B, 0)
    if return_logits:
        return out, (torch.stack(scores, 1) if scores else logits.new_zeros(B, 0, logits.shape[-1]))
    return out
