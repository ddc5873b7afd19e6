"""DiffCLIP: CLIP with differential attention in either tower, as open_clip models.

The architecture is CLIP (Radford et al., arXiv 2103.00020) as laid out by open_clip; DiffCLIP
(Hammoud & Ghanem, arXiv 2503.06626) replaces the softmax attention of both towers by the
differential attention of Ye et al., "Differential Transformer", ICLR 2025 (arXiv 2410.05258).
The differential math of both towers lives only in :mod:`diffzoo.layers`:

* image tower (:class:`DiffVisionTower`): timm's ``VisionTransformer`` with diffzoo's attention
  (:func:`diffzoo.models.vit.vision_transformer`; the softmax baseline keeps timm's own attention) and
  ``num_classes=0`` (class-token features after the final LayerNorm), then ``@ proj`` into the joint space;
* text tower (:class:`DiffTextTower`): token + learned position embeddings, causal blocks, final
  LayerNorm, the features of the EOT token (the largest token id, as open_clip's ``argmax`` pooling),
  then ``@ text_projection``. Padding is masked: every position after a text's EOT token is passed as
  ``key_padding_mask`` (True = padding) on top of the causal mask, so no token attends to padding.
  Padding is found by position, not by ``pad_id``: open_clip's tokenizer pads with id 0, which is also a
  real BPE token.

Integration with open_clip (3.3). open_clip's ``CustomTextCLIP`` holds the towers, so ``encode_image``,
``encode_text(normalize=)``, ``forward`` (tuple or ``output_dict=True``), ``logit_bias``, ``lock_*``
and ``set_grad_checkpointing`` are open_clip's own code. ``CustomTextCLIP`` builds its towers through
the module-level functions ``open_clip.model._build_vision_tower`` / ``_build_text_tower``; importing
this module wraps both once (:func:`diffzoo.hosts.open_clip.install_tower_builders`): a tower config
(dict) that carries a ``"diffzoo"`` entry is built here, every other config goes to open_clip's
original function unchanged. Importing this module also registers the JSON configs of
``diffzoo/models/clip_configs`` with ``open_clip.add_model_config``, so::

    import diffzoo.models.clip, open_clip
    model, _, preprocess = open_clip.create_model_and_transforms("DiffCLIP-nano")
    tokenizer = open_clip.get_tokenizer("DiffCLIP-nano")

and ``open_clip.build_zero_shot_classifier`` / ``open_clip.ClipLoss`` work unchanged.
:func:`create_clip` builds the same models without open_clip's factory.

Limits of the hook: a config with a diffzoo text tower must set ``"custom_text": true`` (open_clip's
plain ``CLIP`` unpacks a text transformer's internals); CoCa (which imported the builders by name)
is not covered; open_clip's ``precision="fp16"/"bf16"`` (low-precision weights with fp32 LayerNorms)
is refused - use ``"amp"``, ``"amp_bf16"`` or ``"pure_bf16"``. Built-in open_clip names keep
open_clip's preprocessing defaults (OpenAI mean/std) unless a config gives ``preprocess_cfg`` in its
``vision_cfg.diffzoo`` entry (the nano configs do): those values replace open_clip's defaults, while
values a caller forces (``image_mean=...``) still win.

Names: ``DiffCLIP-ViT-B-16`` (both towers differential, constant ``lambda_init`` 0.8),
``DiffCLIPstar-ViT-B-16`` (the depth schedule of ``lambda_init``), ``DiffCLIPdagger-ViT-B-16``
(differential image tower, softmax text tower), ``SoftCLIP-ViT-B-16`` (the matched softmax CLIP) and
``DiffCLIP-nano`` / ``DiffCLIPdagger-nano`` / ``SoftCLIP-nano`` (32x32 images and short captions, the
CPU default).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import open_clip
import torch
from open_clip.model import CLIPTextCfg, CLIPVisionCfg, CustomTextCLIP
from open_clip.transform import PreprocessCfg
from open_clip.transformer import QuickGELU
from open_clip.utils import to_2tuple
from timm.layers import LayerNorm
from torch import Tensor, nn

from ..hosts.open_clip import install_tower_builders
from ..layers import GradCheckpointingMixin, Transformer
from ..layers.spec import AttnSpec, get_spec
from ..layers.variants import matched_mlp_ratio
from .vit import diff_head_layout, vision_transformer

__all__ = [
    "CLIP_CONFIG_DIR",
    "DiffTextTower",
    "DiffVisionTower",
    "DiffzooTowerCfg",
    "clip_config",
    "clip_model_names",
    "create_clip",
    "install_open_clip_hooks",
    "with_attn",
    "with_towers",
]

CLIP_CONFIG_DIR = Path(__file__).with_name("clip_configs")

# open_clip's generic preprocessing; values a diffzoo config names replace these (see the module docstring).
_OPEN_CLIP_PREPROCESS_DEFAULTS: dict[str, Any] = dataclasses.asdict(PreprocessCfg())

_ACTIVATIONS = {"gelu": nn.GELU, "quick_gelu": QuickGELU}


@dataclass
class DiffzooTowerCfg:
    """The ``"diffzoo"`` entry of an open_clip ``vision_cfg`` / ``text_cfg``: what open_clip's fields do not say."""

    # attention spec name (diffzoo.layers.spec): "diff" (differential V1, the paper), "diff_v2", "softmax" (the
    # matched baseline) or a study variant; the tower's shape fields stay the softmax baseline's
    attn: str | AttnSpec = "diff"
    lambda_init: float | None = None  # constant lambda_init (DiffCLIP: 0.8); None = 0.8 - 0.6 exp(-0.3 l)
    head_dim: int | None = None  # differential q/k width; needed only when the baseline head count is odd
    act: str | None = None  # MLP activation "gelu" / "quick_gelu"; None follows open_clip's quick_gelu flag
    norm_eps: float = 1e-5  # epsilon of the block and final LayerNorms (open_clip and DiffCLIP use 1e-5)
    qkv_bias: bool = True  # bias on the q/k/v projections (CLIP and DiffCLIP: on)
    drop_path_rate: float = 0.0  # stochastic depth, increased linearly over the blocks up to this value
    attn_drop: float = 0.0  # dropout on the attention maps
    proj_drop: float = 0.0  # dropout after the attention and MLP projections
    backend: str | None = None  # attention kernel backend; None follows diffzoo.kernels' selection
    preprocess_cfg: dict | None = None  # vision only: open_clip PreprocessCfg fields (mean, std, ...)

    def __post_init__(self) -> None:
        try:
            spec = get_spec(self.attn, self.lambda_init)
        except ValueError as e:
            raise ValueError(f"diffzoo.attn: {e}") from None
        if self.act is not None and self.act not in _ACTIVATIONS:
            raise ValueError(f"diffzoo.act={self.act!r}; expected one of {sorted(_ACTIVATIONS)} or null")
        if self.head_dim is not None and spec.kind != "diff":
            raise ValueError(f"diffzoo.head_dim applies to attn='diff' only (got attn={self.attn!r})")
        for name in ("drop_path_rate", "attn_drop", "proj_drop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"diffzoo.{name}={getattr(self, name)} must be in [0, 1)")
        if self.preprocess_cfg is not None:
            unknown = set(self.preprocess_cfg) - set(_OPEN_CLIP_PREPROCESS_DEFAULTS)
            if unknown:
                raise ValueError(
                    f"diffzoo.preprocess_cfg has unknown fields {sorted(unknown)}; "
                    f"expected open_clip PreprocessCfg fields {sorted(_OPEN_CLIP_PREPROCESS_DEFAULTS)}"
                )

    @classmethod
    def from_any(cls, cfg: DiffzooTowerCfg | dict | None) -> DiffzooTowerCfg:
        if isinstance(cfg, cls):
            return cfg
        cfg = dict(cfg or {})
        unknown = set(cfg) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            known = [f.name for f in dataclasses.fields(cls)]
            raise ValueError(f"unknown diffzoo tower fields {sorted(unknown)}; expected {known}")
        return cls(**cfg)

    def act_layer(self, quick_gelu: bool) -> type[nn.Module]:
        return _ACTIVATIONS[self.act or ("quick_gelu" if quick_gelu else "gelu")]


# open_clip tower fields a diffzoo tower reads; every other field must keep open_clip's default.
_VISION_FIELDS = {"layers", "width", "head_width", "mlp_ratio", "patch_size", "image_size", "ls_init_value"}
_TEXT_FIELDS = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio", "ls_init_value",
                "no_causal_mask", "pad_id", "eos_id"}
_TOKENIZER_FIELDS = {"hf_tokenizer_name", "tokenizer_mode", "tokenizer_kwargs"}  # read by get_tokenizer only


def _split_tower_cfg(cfg: Any, cfg_cls: type, read: set[str], kind: str) -> tuple[dict[str, Any], DiffzooTowerCfg]:
    """Validate an open_clip tower config with a ``"diffzoo"`` entry; return its open_clip fields and entry."""
    cfg = dict(cfg)
    entry = DiffzooTowerCfg.from_any(cfg.pop("diffzoo"))
    defaults = dataclasses.asdict(cfg_cls())
    unknown = set(cfg) - set(defaults)
    if unknown:
        raise ValueError(f"{kind} has unknown fields {sorted(unknown)}")
    ignored = read | (_TOKENIZER_FIELDS if cfg_cls is CLIPTextCfg else set())
    unsupported = {k: v for k, v in cfg.items() if k not in ignored and v != defaults[k]}
    if unsupported:
        raise ValueError(
            f"{kind} fields {unsupported} are not supported by diffzoo towers; "
            f"they read {sorted(read)} (plus the 'diffzoo' entry)"
        )
    return {**{k: defaults[k] for k in read}, **{k: v for k, v in cfg.items() if k in read}}, entry


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


# -- image tower ------------------------------------------------------------------------------------
class DiffVisionTower(nn.Module):
    """Image tower: a diffzoo ViT's class-token features projected into the joint space.

    ``features = vision_transformer(num_classes=0)(image) @ proj`` (timm's ViT) with ``proj`` of shape
    ``(width, embed_dim)`` (open_clip's and DiffCLIP's layout).

    Args:
        embed_dim: joint embedding width.
        image_size: input resolution (int or ``(H, W)``).
        patch_size: patch side in pixels.
        width: ViT width ``D``.
        layers: number of blocks.
        head_width: width of a *baseline* head; the baseline has ``width // head_width`` heads, which
            ``attn="diff"`` turns into half as many differential heads of the same total width.
        mlp_ratio: feed-forward hidden width relative to ``width``.
        ls_init_value: LayerScale initial value, or None.
        diffzoo: a :class:`DiffzooTowerCfg` (attention kind, lambda_init, activation, preprocessing).
        quick_gelu: open_clip's flag; used when ``diffzoo.act`` is None.
        in_chans: input channels (CLIP: 3).
    """

    def __init__(
        self,
        embed_dim: int,
        *,
        image_size: int | Sequence[int] = 224,
        patch_size: int = 16,
        width: int = 768,
        layers: int = 12,
        head_width: int = 64,
        mlp_ratio: float = 4.0,
        ls_init_value: float | None = None,
        diffzoo: DiffzooTowerCfg | dict | None = None,
        quick_gelu: bool = False,
        in_chans: int = 3,
    ) -> None:
        super().__init__()
        cfg = DiffzooTowerCfg.from_any(diffzoo)
        if width % head_width:
            raise ValueError(f"vision width={width} is not divisible by head_width={head_width}")
        self.image_size = to_2tuple(image_size)
        self.patch_size = to_2tuple(patch_size)
        self.in_chans = in_chans
        self.output_dim = embed_dim
        self.attn_kind = get_spec(cfg.attn).kind
        num_heads = width // head_width
        if cfg.head_dim is not None and cfg.head_dim != diff_head_layout(width, num_heads)[2]:
            raise ValueError(
                f"diffzoo.head_dim={cfg.head_dim} differs from the layout {num_heads} baseline heads give "
                f"(head_dim={diff_head_layout(width, num_heads)[2]}); drop diffzoo.head_dim"
            )
        self.trunk = vision_transformer(
            cfg.attn, lambda_init=cfg.lambda_init, backend=cfg.backend,
            img_size=self.image_size, patch_size=patch_size, in_chans=in_chans, num_classes=0, global_pool="token",
            embed_dim=width, depth=layers, num_heads=num_heads, mlp_ratio=mlp_ratio,
            act_layer=cfg.act_layer(quick_gelu), qkv_bias=cfg.qkv_bias, proj_drop_rate=cfg.proj_drop,
            attn_drop_rate=cfg.attn_drop, drop_path_rate=cfg.drop_path_rate, init_values=ls_init_value,
            norm_layer=partial(LayerNorm, eps=cfg.norm_eps),
        )
        self.proj = nn.Parameter(width ** -0.5 * torch.randn(width, embed_dim))
        self._own_preprocess = dict(cfg.preprocess_cfg or {})
        self._preprocess: dict[str, Any] = {}
        self.preprocess_cfg = dict(_OPEN_CLIP_PREPROCESS_DEFAULTS, size=self.image_size)

    # -- preprocessing config (read by open_clip's transforms) ----------------------------------
    # open_clip's factory sets ``visual.preprocess_cfg`` (and the legacy ``image_mean`` / ``image_std``)
    # to its generic defaults for built-in names; values this model's config names replace those.
    def _overlay(self, key: str, value: Any) -> Any:
        if key in self._own_preprocess and _same_value(value, _OPEN_CLIP_PREPROCESS_DEFAULTS.get(key)):
            return copy.deepcopy(self._own_preprocess[key])
        return value

    @property
    def preprocess_cfg(self) -> dict[str, Any]:
        """open_clip ``PreprocessCfg`` fields for this tower's inputs (size, mean, std, interpolation, ...)."""
        return copy.deepcopy(self._preprocess)

    @preprocess_cfg.setter
    def preprocess_cfg(self, cfg: dict[str, Any]) -> None:
        self._preprocess = {k: self._overlay(k, v) for k, v in dict(cfg).items()}

    @property
    def image_mean(self) -> tuple[float, ...]:
        return tuple(self._preprocess["mean"])

    @image_mean.setter
    def image_mean(self, value: Sequence[float]) -> None:
        self._preprocess["mean"] = self._overlay("mean", value)

    @property
    def image_std(self) -> tuple[float, ...]:
        return tuple(self._preprocess["std"])

    @image_std.setter
    def image_std(self, value: Sequence[float]) -> None:
        self._preprocess["std"] = self._overlay("std", value)

    # -- open_clip tower interface -------------------------------------------------------------
    def lock(self, unlocked_groups: int = 0, freeze_bn_stats: bool = False) -> None:
        """Freeze the tower except its last ``unlocked_groups`` groups (LiT; open_clip's grouping:
        stem, blocks, last block + final norm, projection)."""
        for p in self.parameters():
            p.requires_grad = False
        if unlocked_groups:
            t = self.trunk
            groups: list[list[Any]] = [
                [t.patch_embed, t.cls_token, t.pos_embed],
                *[[blk] for blk in t.blocks[:-1]],
                [t.blocks[-1], t.norm],
                [self.proj],
            ]
            for group in groups[-unlocked_groups:]:
                for item in group:
                    for p in ([item] if isinstance(item, nn.Parameter) else item.parameters()):
                        p.requires_grad = True

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.trunk.set_grad_checkpointing(enable)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {f"trunk.{n}" for n in self.trunk.no_weight_decay()}

    def _check_image(self, image: Tensor) -> None:
        if not isinstance(image, Tensor):
            raise TypeError(f"image must be a torch.Tensor, got {type(image).__name__}")
        expected = (self.in_chans, *self.image_size)
        if image.dim() != 4 or tuple(image.shape[1:]) != expected:
            raise ValueError(
                f"image must have shape (batch, {expected[0]}, {expected[1]}, {expected[2]}), got {tuple(image.shape)}; "
                "use the model's preprocess transform (open_clip.create_model_and_transforms) to resize and normalise"
            )
        if not image.is_floating_point():
            raise ValueError(f"image must be a floating-point tensor (normalised pixels), got {image.dtype}")

    def forward(self, image: Tensor) -> Tensor:
        """``(B, 3, H, W)`` normalised images -> ``(B, embed_dim)`` features (not L2-normalised)."""
        self._check_image(image)
        x = self.trunk.forward_head(self.trunk.forward_features(image), pre_logits=True)  # (B, width)
        return x @ self.proj  # (B, embed_dim)

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | None = None,
        stop_early: bool = False,
        normalize_intermediates: bool = False,
        intermediates_only: bool = False,
        output_fmt: str = "NCHW",
        output_extra_tokens: bool = False,
    ) -> dict[str, Tensor | list[Tensor]]:
        """Block outputs as open_clip's ``VisionTransformer.forward_intermediates`` returns them.

        Args:
            indices: last ``n`` blocks (int), all (None) or the listed block indices.
            stop_early: stop after the last requested block (only with ``intermediates_only``).
            normalize_intermediates: apply the final LayerNorm to every intermediate.
            intermediates_only: return only the intermediates.
            output_fmt: ``"NCHW"`` (patch grid) or ``"NLC"`` (token sequence).
            output_extra_tokens: also return the class-token intermediates (``image_intermediates_prefix``).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r}; expected 'NCHW' or 'NLC'")
        self._check_image(x)
        t = self.trunk
        # open_clip stops early only when the final features are not wanted.
        res = t.forward_intermediates(
            x, indices, return_prefix_tokens=output_extra_tokens, norm=normalize_intermediates,
            stop_early=stop_early and intermediates_only, output_fmt=output_fmt, intermediates_only=intermediates_only,
        )
        final, intermediates = (None, res) if intermediates_only else res
        out: dict[str, Tensor | list[Tensor]] = {}
        if output_extra_tokens:
            out["image_intermediates"] = [y for y, _ in intermediates]
            out["image_intermediates_prefix"] = [p for _, p in intermediates]
        else:
            out["image_intermediates"] = list(intermediates)
        if final is not None:
            out["image_features"] = t.forward_head(final, pre_logits=True) @ self.proj
        return out


# -- text tower -------------------------------------------------------------------------------------
# Attributes open_clip's plain ``CLIP`` takes from a text tower; a diffzoo tower has none of them.
_CLIP_UNPACKED = {"transformer", "attn_mask", "text_pool_type", "pool_type", "eos_id"}


class DiffTextTower(GradCheckpointingMixin, nn.Module):
    """Text tower: a causal differential (or softmax) transformer over open_clip's tokenizer ids.

    ``x = token_embedding(text) + positional_embedding``; blocks with causal and key-padding masks
    (positions after the EOT token are padding); ``ln_final``; the EOT token's features (the largest
    id of each row, open_clip's ``argmax`` pooling) ``@ text_projection``.

    Args:
        embed_dim: joint embedding width.
        context_length: maximum number of tokens (position embeddings).
        vocab_size: token ids (open_clip's tokenizer: 49408).
        width: transformer width.
        heads: heads of the *softmax baseline* (open_clip's ``text_cfg`` name for what diffzoo's other
            configs call ``baseline_heads``; ``attn="diff"`` uses ``heads / 2`` differential heads).
        layers: number of blocks.
        mlp_ratio: feed-forward hidden width relative to ``width``.
        ls_init_value: LayerScale initial value, or None.
        no_causal_mask: attend in both directions (padding stays masked).
        pad_id: the tokenizer's pad id (documentation only: padding is found by position, see above).
        eos_id: unused (pooling is ``argmax``); accepted for open_clip config compatibility.
        diffzoo: a :class:`DiffzooTowerCfg`.
        quick_gelu: open_clip's flag; used when ``diffzoo.act`` is None.
    """

    def __init__(
        self,
        embed_dim: int,
        *,
        context_length: int = 77,
        vocab_size: int = 49408,
        width: int = 512,
        heads: int = 8,
        layers: int = 12,
        mlp_ratio: float = 4.0,
        ls_init_value: float | None = None,
        no_causal_mask: bool = False,
        pad_id: int = 0,
        eos_id: int = 2,
        diffzoo: DiffzooTowerCfg | dict | None = None,
        quick_gelu: bool = False,
    ) -> None:
        super().__init__()
        cfg = DiffzooTowerCfg.from_any(diffzoo)
        if cfg.preprocess_cfg is not None:
            raise ValueError("diffzoo.preprocess_cfg belongs to the vision tower, not the text tower")
        for name, value in (("context_length", context_length), ("vocab_size", vocab_size), ("layers", layers)):
            if value < 1:
                raise ValueError(f"text {name}={value} must be positive")
        self.context_length, self.vocab_size, self.width = context_length, vocab_size, width
        self.attn_spec = spec = get_spec(cfg.attn, cfg.lambda_init)
        self.pad_id, self.output_dim, self.attn_kind = pad_id, embed_dim, spec.kind
        self.causal = not no_causal_mask
        if spec.match_params:
            mlp_ratio = matched_mlp_ratio(lambda s, r: DiffTextTower(
                embed_dim, context_length=context_length, vocab_size=vocab_size, width=width, heads=heads,
                layers=layers, mlp_ratio=r, ls_init_value=ls_init_value, no_causal_mask=no_causal_mask,
                diffzoo=dataclasses.replace(cfg, attn=s, lambda_init=None,
                                            head_dim=cfg.head_dim if s.kind == "diff" else None),
                quick_gelu=quick_gelu), spec, width, mlp_ratio)
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = nn.Parameter(torch.empty(context_length, width))
        act = cfg.act_layer(quick_gelu)
        self.blocks = Transformer(
            width, layers, heads, attn=spec, head_dim=cfg.head_dim, mlp_ratio=mlp_ratio, qkv_bias=cfg.qkv_bias, causal=self.causal, attn_drop=cfg.attn_drop,
            proj_drop=cfg.proj_drop, drop_path_rate=cfg.drop_path_rate, layer_scale_init=ls_init_value,
            act_layer=act, norm_eps=cfg.norm_eps, backend=cfg.backend,
        )
        self.ln_final = nn.LayerNorm(width, eps=cfg.norm_eps)
        self.text_projection = nn.Parameter(torch.empty(width, embed_dim))
        self.init_parameters()

    def init_parameters(self) -> None:
        """open_clip's text-transformer init (normal, std from width and depth); biases of the attention
        projections zero; differential-attention parameters keep the init of :mod:`diffzoo.layers`."""
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.positional_embedding, std=0.01)
        attn_std = self.width ** -0.5
        proj_std = self.width ** -0.5 * (2 * len(self.blocks)) ** -0.5
        fc_std = (2 * self.width) ** -0.5
        for blk in self.blocks:
            for lin, std in ((blk.attn.q_proj, attn_std), (blk.attn.k_proj, attn_std), (blk.attn.v_proj, attn_std),
                             (blk.attn.out_proj, proj_std)):
                nn.init.normal_(lin.weight, std=std)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
            nn.init.normal_(blk.mlp.fc1.weight, std=fc_std)
            nn.init.normal_(blk.mlp.fc2.weight, std=proj_std)
        nn.init.normal_(self.text_projection, std=self.width ** -0.5)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in _CLIP_UNPACKED:
                raise AttributeError(
                    f"diffzoo text towers have no {name!r}: they need open_clip's CustomTextCLIP; set "
                    '"custom_text": true in the model config or pass force_custom_text=True'
                ) from None
            raise

    # -- open_clip tower interface -------------------------------------------------------------
    def lock(self, unlocked_layers: int = 0, freeze_layer_norm: bool = True) -> None:
        """Freeze the tower except its last ``unlocked_layers`` groups (open_clip's grouping:
        embeddings, blocks, last block + ``ln_final``, projection)."""
        if not freeze_layer_norm:
            raise ValueError("freeze_layer_norm=False is not supported (LayerNorms are locked like other weights)")
        for p in self.parameters():
            p.requires_grad = False
        if unlocked_layers:
            groups: list[list[Any]] = [
                [self.token_embedding, self.positional_embedding],
                *[[blk] for blk in self.blocks[:-1]],
                [self.blocks[-1], self.ln_final],
                [self.text_projection],
            ]
            for group in groups[-unlocked_layers:]:
                for item in group:
                    for p in ([item] if isinstance(item, nn.Parameter) else item.parameters()):
                        p.requires_grad = True

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"positional_embedding"}

    def _check_text(self, text: Tensor) -> None:
        if not isinstance(text, Tensor):
            raise TypeError(f"text must be a torch.Tensor of token ids, got {type(text).__name__}; tokenize first")
        if text.dim() != 2:
            raise ValueError(
                f"text must be 2-D (batch, tokens) token ids, got shape {tuple(text.shape)}; "
                "use open_clip.get_tokenizer(name)(list_of_strings)"
            )
        if text.dtype == torch.bool or text.is_floating_point() or text.is_complex():
            raise ValueError(f"text must hold integer token ids, got dtype {text.dtype}")
        if not 1 <= text.shape[1] <= self.context_length:
            raise ValueError(f"text has {text.shape[1]} tokens; this model takes 1 to context_length={self.context_length}")
        # The range check reads values: skipped on an accelerator (it would synchronise) and in a
        # compiled or exported graph (it would end the graph).
        if text.device.type == "cpu" and text.numel() and not torch.compiler.is_compiling():
            lo, hi = int(text.min()), int(text.max())
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(f"text token ids must lie in [0, {self.vocab_size}), got min {lo}, max {hi}")

    def _embed(self, text: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Token ids -> embedded tokens, the EOT positions and the padding mask (True after the EOT)."""
        self._check_text(text)
        B, N = text.shape
        eot = text.argmax(dim=-1)  # (B,) the EOT token has the largest id
        key_padding_mask = torch.arange(N, device=text.device) > eot[:, None]  # (B, N)
        x = self.token_embedding(text) + self.positional_embedding[:N]  # (B, N, width)
        return x, eot, key_padding_mask

    def _pool(self, x: Tensor, eot: Tensor) -> Tensor:
        return x[torch.arange(x.shape[0], device=x.device), eot] @ self.text_projection  # (B, embed_dim)

    def forward(self, text: Tensor) -> Tensor:
        """``(B, N)`` token ids (``N <= context_length``) -> ``(B, embed_dim)`` features (not L2-normalised)."""
        x, eot, key_padding_mask = self._embed(text)
        x = self.blocks(x, key_padding_mask=key_padding_mask)  # (B, N, width)
        return self._pool(self.ln_final(x), eot)

    def forward_intermediates(
        self,
        text: Tensor,
        indices: int | list[int] | None = None,
        stop_early: bool = False,
        normalize_intermediates: bool = False,
        intermediates_only: bool = False,
        output_fmt: str = "NLC",
        output_extra_tokens: bool = False,
    ) -> dict[str, Tensor | list[Tensor]]:
        """Block outputs ``(B, N, width)`` as open_clip's ``TextTransformer.forward_intermediates`` returns them."""
        if output_fmt != "NLC":
            raise ValueError(f"output_fmt={output_fmt!r}; text intermediates are 'NLC'")
        x, eot, key_padding_mask = self._embed(text)
        x, intermediates = self.blocks.forward_intermediates(
            x, indices, stop_early=stop_early and intermediates_only, key_padding_mask=key_padding_mask
        )
        if normalize_intermediates:
            intermediates = [self.ln_final(t) for t in intermediates]
        out: dict[str, Tensor | list[Tensor]] = {"text_intermediates": intermediates}
        if not intermediates_only:
            out["text_features"] = self._pool(self.ln_final(x), eot)
        return out


# -- open_clip hooks --------------------------------------------------------------------------------
def _refuse_cast_dtype(cast_dtype: torch.dtype | None) -> None:
    if cast_dtype is not None:
        raise ValueError(
            f"open_clip precision with cast_dtype={cast_dtype} (low-precision weights, fp32 LayerNorms) is not "
            "supported by diffzoo towers; use precision='amp', 'amp_bf16' or 'pure_bf16'"
        )


def build_vision_tower(embed_dim: int, vision_cfg: dict, quick_gelu: bool = False,
                       cast_dtype: torch.dtype | None = None) -> DiffVisionTower:
    """Build a :class:`DiffVisionTower` from an open_clip ``vision_cfg`` dict with a ``"diffzoo"`` entry."""
    _refuse_cast_dtype(cast_dtype)
    fields, entry = _split_tower_cfg(vision_cfg, CLIPVisionCfg, _VISION_FIELDS, "vision_cfg")
    if isinstance(fields["layers"], (list, tuple)):
        raise ValueError("vision_cfg.layers must be an int (a ViT); ResNet towers are not diffzoo towers")
    return DiffVisionTower(embed_dim, diffzoo=entry, quick_gelu=quick_gelu, **fields)


def build_text_tower(embed_dim: int, text_cfg: dict, quick_gelu: bool = False,
                     cast_dtype: torch.dtype | None = None) -> DiffTextTower:
    """Build a :class:`DiffTextTower` from an open_clip ``text_cfg`` dict with a ``"diffzoo"`` entry."""
    _refuse_cast_dtype(cast_dtype)
    fields, entry = _split_tower_cfg(text_cfg, CLIPTextCfg, _TEXT_FIELDS, "text_cfg")
    return DiffTextTower(embed_dim, diffzoo=entry, quick_gelu=quick_gelu, **fields)


def install_open_clip_hooks() -> None:
    """Let open_clip's factory build diffzoo towers (idempotent; see
    :func:`diffzoo.hosts.open_clip.install_tower_builders`): tower configs with a ``"diffzoo"`` entry are built
    by :func:`build_vision_tower` / :func:`build_text_tower`, all others by open_clip unchanged."""
    install_tower_builders(build_vision_tower, build_text_tower)


# -- configs ----------------------------------------------------------------------------------------
def clip_model_names() -> list[str]:
    """Names of the diffzoo CLIP configs (registered with open_clip on import)."""
    return sorted(p.stem for p in CLIP_CONFIG_DIR.glob("*.json"))


def clip_config(name: str) -> dict[str, Any]:
    """A copy of the open_clip model config (JSON) of ``name``."""
    path = CLIP_CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"{name!r} is not a diffzoo CLIP config; expected one of {clip_model_names()}")
    return json.loads(path.read_text())


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


_TOWERS = ("vision_cfg", "text_cfg")  # the tower configs of an open_clip model config


def with_towers(name: str, model_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """``model_kwargs`` for ``open_clip.create_model("<name>", **kwargs)`` with any tower config in it
    (``vision_cfg``, ``text_cfg``) merged into the diffzoo CLIP ``name``'s own: open_clip's factory replaces a
    whole tower config with the one given, so ``{"vision_cfg": {"width": 64}}`` would otherwise drop the image
    size, patch size, depth and attention of ``name``'s image tower."""
    base = clip_config(name)
    kwargs = dict(model_kwargs or {})
    for tower in _TOWERS:
        if isinstance(kwargs.get(tower), dict):
            kwargs[tower] = _merge(base[tower], kwargs[tower])
    return kwargs


def with_attn(name: str, attn: str | AttnSpec, model_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """``open_clip.create_model`` keyword arguments that build the diffzoo CLIP ``name`` with the attention spec
    ``attn`` in both towers (the towers' shapes stay those of ``name``; the attention spec's lambda-init rule replaces
    the config's ``lambda_init``). ``model_kwargs`` are further arguments; its tower configs are merged in.
    """
    spec = get_spec(attn)
    given = dict(model_kwargs or {})
    kwargs = with_towers(name, {**given, **{tower: given.get(tower) or {} for tower in _TOWERS}})  # both, whole
    for tower in _TOWERS:
        cfg = kwargs[tower]
        if "diffzoo" not in cfg:
            raise ValueError(f"the {tower} of {name!r} is open_clip's own tower; attn applies to diffzoo towers")
        cfg["diffzoo"] = {**cfg["diffzoo"], "attn": spec.name, "lambda_init": None}
        if spec.kind != "diff":
            cfg["diffzoo"].pop("head_dim", None)
    return kwargs


def create_clip(name: str, *, device: str | torch.device | None = None, **overrides: Any) -> CustomTextCLIP:
    """Build a diffzoo CLIP without open_clip's factory (no weights, no transforms).

    Args:
        name: one of :func:`clip_model_names`.
        device: build the parameters there; ``"meta"`` allocates nothing (for counting parameters).
        overrides: model config entries; dicts merge into the config recursively, e.g.
            ``vision_cfg={"layers": 2}``, ``text_cfg={"diffzoo": {"backend": "reference"}}``,
            ``output_dict=True``, ``init_logit_bias=-10.0``.

    Returns:
        open_clip's ``CustomTextCLIP`` holding a :class:`DiffVisionTower` and a :class:`DiffTextTower`
        (or open_clip's own tower for a tower config without a ``"diffzoo"`` entry).
    """
    install_open_clip_hooks()
    cfg = _merge(clip_config(name), overrides)
    cfg.pop("custom_text", None)
    with torch.device(device) if device is not None else nullcontext():
        return CustomTextCLIP(**cfg)


install_open_clip_hooks()
if not set(clip_model_names()) <= set(open_clip.list_models()):
    open_clip.add_model_config(CLIP_CONFIG_DIR)
