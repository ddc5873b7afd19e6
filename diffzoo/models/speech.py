"""Differential speech encoders over log-mel spectrograms, with matched softmax baselines.

The architecture follows the Keyword Transformer (KWT; Berg et al., Interspeech 2021, arXiv 2104.11178:
one token per spectrogram frame, a class token, a pre-norm transformer) and the Audio Spectrogram
Transformer (AST; Gong et al., Interspeech 2021, arXiv 2104.01778: 2-D patches of the spectrogram).
Every block is a :class:`diffzoo.layers.Block`, so the attention is the differential attention of
Ye et al., "Differential Transformer", ICLR 2025 (arXiv 2410.05258) or the softmax attention of the
matched baseline. The front end is torchaudio's ``MelSpectrogram`` with SpecAugment (Park et al.,
arXiv 1904.08779) ``FrequencyMasking`` / ``TimeMasking`` applied in training only.

Variable-length audio: pass ``lengths`` (valid samples per clip). A frame is valid when its whole
analysis window lies inside the clip (``center=False``), a token when all of its frames are valid, and
padded tokens are masked out as keys (``key_padding_mask``) and from average pooling. A zero-padded
clip therefore gives the same features on its valid tokens as the clip alone (tested).

After ``import diffzoo.models.speech`` the models are in timm's registry::

    import timm, diffzoo.models.speech
    model = timm.create_model("diffkwt_1", num_classes=35)
    logits = model(waveform, lengths)                 # (B, T) at 16 kHz, (B,) samples -> (B, 35)
    feats = model.forward_features(waveform, lengths)  # .frames (B, N, D), .padding_mask (B, N)

Names: ``diffkwt_*`` / ``softkwt_*`` (frame tokens) and ``diffast_*`` / ``softast_*`` (16x16 patches);
each differential model's parameter count is within 0.5 % of its softmax partner.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, NamedTuple

import torch
from timm.layers import trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import Tensor, nn

from ..layers import GradCheckpointingMixin, Transformer
from ..layers.spec import AttnSpec, get_spec
from ..layers.variants import matched_mlp_ratio
from ._renamed import accept_former_names, current_names
from .vit import vit_init_

__all__ = [
    "LogMelFrontend", "SPEECH_RENAMED", "SpeechEncoderConfig", "SpeechFeatures", "SpeechTransformer", "SPEECH_CONFIGS",
    "speech_model_names", "matched_speech_name",
]


SPEECH_RENAMED = {"num_heads": "baseline_heads"}  # former config name -> field


@accept_former_names(SPEECH_RENAMED)
@dataclass
class SpeechEncoderConfig:
    """Front end and transformer of a speech encoder (one field switches softmax / differential).

    Front end (log-mel, torchaudio):
        sample_rate: input sample rate in Hz.
        n_fft: FFT size in samples (the analysis window is zero-padded to it).
        win_length: analysis window in samples (480 = 30 ms at 16 kHz, as KWT).
        hop_length: frame hop in samples (160 = 10 ms).
        n_mels: mel bands.
        f_min, f_max: mel filter range in Hz (None: Nyquist).
        mel_mean, mel_std: fixed normalisation of ``log(mel + 1e-6)`` (a data-set constant, as AST).
        max_seconds: longest input the position embeddings cover.
    SpecAugment (training only):
        freq_masks, freq_mask_param: number of frequency masks and their largest width in bands.
        time_masks, time_mask_param: number of time masks and their largest width in frames.
    Tokens:
        patch_freq: mel bands per token (``n_mels``: one token per frame group, KWT; 16: AST patches).
        patch_time: frames per token.
    Transformer:
        embed_dim: width ``D``.
        depth: blocks.
        baseline_heads: heads of the *softmax baseline* (the one head-count name of diffzoo's model
            configs; former name ``num_heads``, still accepted and readable). ``attn="diff"`` converts them
            (2H -> H); an attention layer's own ``num_heads`` is the count it runs.
        head_dim: differential q/k width, needed for an odd ``baseline_heads`` (KWT-1: 1 head).
        attn: an attention spec name (:mod:`diffzoo.layers.spec`): ``"diff"``, ``"softmax"``, ``"diff_v2"`` or a
            study variant (``"diff_nonorm"``, ``"diff_v2_matched"``, ...); the shape fields stay the softmax
            baseline's (a parameter-matched spec narrows the feed-forward when the model is built).
        mlp_ratio: feed-forward width relative to ``D``.
        qkv_bias: biases on q/k/v.
        lambda_init: constant lambda_init; None uses the paper's depth schedule.
        global_pool: ``"token"`` (class token) or ``"avg"`` (mean over valid tokens).
        drop_rate, proj_drop_rate, attn_drop_rate, drop_path_rate: dropouts (drop path grows linearly).
        backend: attention kernel backend (None: :mod:`diffzoo.kernels` decides).
    """

    sample_rate: int = 16000
    n_fft: int = 480
    win_length: int = 480
    hop_length: int = 160
    n_mels: int = 40
    f_min: float = 20.0
    f_max: float | None = None
    mel_mean: float = -4.4  # measured on the synthesised keywords (train split, noise mixed in)
    mel_std: float = 3.3
    max_seconds: float = 1.0
    freq_masks: int = 2
    freq_mask_param: int = 7
    time_masks: int = 2
    time_mask_param: int = 20
    patch_freq: int = 40
    patch_time: int = 1
    embed_dim: int = 64
    depth: int = 12
    baseline_heads: int = 1  # heads of the softmax baseline (attn="diff" runs baseline_heads / 2)
    head_dim: int | None = None
    attn: str | AttnSpec = "diff"
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    lambda_init: float | None = None
    global_pool: Literal["token", "avg"] = "token"
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    backend: str | None = None

    def __post_init__(self) -> None:
        get_spec(self.attn, self.lambda_init)  # one-line error for an unknown name or a misplaced lambda_init
        if self.n_mels % self.patch_freq:
            raise ValueError(f"patch_freq={self.patch_freq} must divide n_mels={self.n_mels}")
        if self.win_length > self.n_fft:
            raise ValueError(f"win_length={self.win_length} is longer than n_fft={self.n_fft}")
        if self.global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool={self.global_pool!r}; expected 'token' or 'avg'")
        if self.depth < 1 or self.patch_time < 1:
            raise ValueError(f"depth={self.depth} and patch_time={self.patch_time} must be >= 1")
        if self.max_time_tokens < 1:
            raise ValueError(f"max_seconds={self.max_seconds} is shorter than one token")

    @property
    def max_time_tokens(self) -> int:
        """Time positions covered by the position embedding."""
        return num_frames(int(round(self.max_seconds * self.sample_rate)), self.n_fft, self.hop_length) // self.patch_time

    @property
    def freq_tokens(self) -> int:
        return self.n_mels // self.patch_freq


def num_frames(num_samples, n_fft: int, hop_length: int):
    """Frames whose whole window fits in ``num_samples`` (``center=False``); int or tensor."""
    if isinstance(num_samples, Tensor):
        return torch.where(num_samples >= n_fft, (num_samples - n_fft) // hop_length + 1, 0)
    return (num_samples - n_fft) // hop_length + 1 if num_samples >= n_fft else 0


class SpeechFeatures(NamedTuple):
    """Output of :meth:`SpeechTransformer.forward_features`.

    Attributes:
        frames: ``(B, N, D)`` normalised token features, time-major (``N = T' * F'``); the input of a
            CTC or sequence head.
        padding_mask: ``(B, N)`` bool, True marks a padded token.
        cls_token: ``(B, D)`` normalised class-token feature.
    """

    frames: Tensor
    padding_mask: Tensor
    cls_token: Tensor


class LogMelFrontend(nn.Module):
    """Waveform ``(B, T)`` -> normalised log-mel ``(B, n_mels, frames)`` and valid frames ``(B,)``.

    SpecAugment masks are drawn per example in training mode only.
    """

    def __init__(self, cfg: SpeechEncoderConfig) -> None:
        super().__init__()
        import torchaudio

        self.cfg = cfg
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=cfg.sample_rate, n_fft=cfg.n_fft, win_length=cfg.win_length, hop_length=cfg.hop_length,
            f_min=cfg.f_min, f_max=cfg.f_max, n_mels=cfg.n_mels, center=False, power=2.0,
        )
        self.freq_mask = torchaudio.transforms.FrequencyMasking(cfg.freq_mask_param, iid_masks=True)
        self.time_mask = torchaudio.transforms.TimeMasking(cfg.time_mask_param, iid_masks=True)

    def _power_spectrum(self, wave: Tensor) -> Tensor:
        """``|STFT|^2`` ``(B, n_fft // 2 + 1, frames)`` with the window and settings of ``self.mel``.

        The same computation as torchaudio's ``Spectrogram`` (which squares ``abs``; the sum of squares here
        is equal up to rounding and cheaper), whose option parsing ``torch.compile`` cannot trace; the mel
        filterbank is then torchaudio's own (``self.mel.mel_scale``).
        """
        stft = self.mel.spectrogram
        spec = torch.stft(
            wave, n_fft=stft.n_fft, hop_length=stft.hop_length, win_length=stft.win_length, window=stft.window,
            center=False, normalized=False, onesided=True, return_complex=True,
        )
        return torch.view_as_real(spec).pow(2).sum(-1)  # |z|^2 as re^2 + im^2: no square root to undo

    def prepare(self, wave: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The waveform as ``(B, T)``, zero-padded to at least one window, and valid samples ``(B,)``.

        Accepts ``(B, T)``, ``(B, 1, T)`` and timm's ``(B, 1, 1, T)``; ``lengths`` defaults to the whole clip.
        """
        if wave.dim() == 4 and wave.shape[1:3] == (1, 1):  # timm's (B, C, H, W) batch of input_size (1, 1, T)
            wave = wave[:, 0, 0]
        if wave.dim() == 3 and wave.shape[1] == 1:
            wave = wave[:, 0]
        if wave.dim() != 2:
            raise ValueError(
                f"expected a waveform batch (B, T), (B, 1, T) or (B, 1, 1, T), got shape {tuple(wave.shape)}"
            )
        if wave.shape[-1] < self.cfg.n_fft:
            wave = nn.functional.pad(wave, (0, self.cfg.n_fft - wave.shape[-1]))
        total = torch.full((wave.shape[0],), wave.shape[-1], device=wave.device)
        lengths = total if lengths is None else lengths.to(wave.device).clamp(max=wave.shape[-1])
        return wave, lengths

    def num_frames(self, num_samples: int | Tensor) -> int | Tensor:
        """Frames whose whole analysis window lies in ``num_samples`` (int or tensor of sample counts)."""
        return num_frames(num_samples, self.cfg.n_fft, self.cfg.hop_length)

    def forward(self, wave: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
        wave, lengths = self.prepare(wave, lengths)
        with torch.autocast(wave.device.type, enabled=False):  # the FFT and log want fp32
            spec = (self.mel.mel_scale(self._power_spectrum(wave.float())) + 1e-6).log()  # (B, n_mels, frames)
        spec = (spec - self.cfg.mel_mean) / self.cfg.mel_std
        if self.training:
            spec = spec.unsqueeze(1)  # iid masks need (B, C, F, T)
            for _ in range(self.cfg.freq_masks):
                spec = self.freq_mask(spec)
            for _ in range(self.cfg.time_masks):
                spec = self.time_mask(spec)
            spec = spec.squeeze(1)
        return spec, self.num_frames(lengths)


class SpeechTransformer(GradCheckpointingMixin, nn.Module):
    """Log-mel front end, frame or patch tokens, bidirectional (differential) transformer, classifier.

    Args:
        num_classes: classifier outputs; 0 for none (``forward`` returns pooled features).
        in_chans: must be 1 (mono audio; the argument exists for timm's ``create_model``).
        config: a :class:`SpeechEncoderConfig`; keyword arguments override its fields.
    """

    def __init__(self, num_classes: int = 12, in_chans: int = 1, config: SpeechEncoderConfig | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        if in_chans != 1:
            raise ValueError(f"in_chans={in_chans}: speech encoders take mono audio (mix channels down first)")
        known = {f.name for f in fields(SpeechEncoderConfig)}
        unknown = sorted(set(kwargs) - known - set(SPEECH_RENAMED))
        if unknown:
            raise TypeError(f"unknown SpeechTransformer argument(s) {unknown}; config fields are {sorted(known)}")
        kwargs = current_names(kwargs, SPEECH_RENAMED)
        base = asdict(config) if config is not None else {}
        cfg = self.cfg = SpeechEncoderConfig(**{**base, **kwargs})
        self.num_classes = num_classes
        self.global_pool = cfg.global_pool
        self.attn_spec = spec = get_spec(cfg.attn, cfg.lambda_init)
        self.attn_kind = spec.kind
        mlp_ratio = cfg.mlp_ratio
        if spec.match_params:
            mlp_ratio = matched_mlp_ratio(lambda s, r: SpeechTransformer(config=replace(
                cfg, attn=s, mlp_ratio=r, head_dim=cfg.head_dim if s.kind == "diff" else None,
                lambda_init=None)), spec, cfg.embed_dim, cfg.mlp_ratio)
        self.num_features = self.head_hidden_size = self.embed_dim = cfg.embed_dim
        self.num_prefix_tokens = 1

        self.frontend = LogMelFrontend(cfg)
        # (B, 1, n_mels, frames) -> (B, D, F', T'): non-overlapping patches, one per token
        self.patch_embed = nn.Conv2d(1, cfg.embed_dim, (cfg.patch_freq, cfg.patch_time), (cfg.patch_freq, cfg.patch_time))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.max_time_tokens, cfg.freq_tokens, cfg.embed_dim))
        self.blocks = Transformer(
            cfg.embed_dim, cfg.depth, cfg.baseline_heads, attn=spec,
            head_dim=cfg.head_dim if spec.kind == "diff" else None, mlp_ratio=mlp_ratio, qkv_bias=cfg.qkv_bias, attn_drop=cfg.attn_drop_rate,
            proj_drop=cfg.proj_drop_rate, drop_path_rate=cfg.drop_path_rate, backend=cfg.backend,
        )
        self.norm = nn.LayerNorm(cfg.embed_dim, eps=1e-6)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(cfg.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()

    def init_weights(self) -> None:
        """ViT init: truncated normal (std 0.02) for linears and positions; attention extras keep theirs."""
        vit_init_(self, self.pos_embed, self.cls_token)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the classifier by a fresh one with ``num_classes`` outputs (0 removes it)."""
        if global_pool is not None:
            if global_pool not in ("token", "avg"):
                raise ValueError(f"global_pool={global_pool!r}; expected 'token' or 'avg'")
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        if num_classes > 0:
            trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    # -- framing -------------------------------------------------------------------------------
    @property
    def frames_per_token(self) -> int:
        """Spectrogram frames per time token (``patch_time``)."""
        return self.cfg.patch_time

    def time_tokens(self, num_samples: int) -> int:
        """Time positions ``T'`` of the tokens of an input of ``num_samples`` samples (padding included)."""
        return self.frontend.num_frames(max(int(num_samples), self.cfg.n_fft)) // self.frames_per_token

    def num_tokens(self, num_samples: int) -> int:
        """Tokens ``N = T' * F'`` of an input of ``num_samples`` samples, without the class token."""
        return self.time_tokens(num_samples) * self.cfg.freq_tokens

    def valid_time_tokens(self, lengths: Tensor) -> Tensor:
        """Time tokens whose frames all lie inside ``lengths`` valid samples, ``(B,)`` int64."""
        return self.frontend.num_frames(lengths) // self.frames_per_token

    def token_times(self, num_samples: int) -> Tensor:
        """``(T', 2)`` fp64 start and end in seconds of the samples each time token's frames read."""
        cfg = self.cfg
        t = torch.arange(self.time_tokens(num_samples), dtype=torch.float64)
        start = t * self.frames_per_token * cfg.hop_length
        end = start + (self.frames_per_token - 1) * cfg.hop_length + cfg.n_fft
        return torch.stack([start, end], -1) / cfg.sample_rate

    # -- forward -------------------------------------------------------------------------------
    def tokenize(self, wave: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Waveform ``(B, T)`` -> tokens with positions ``(B, N, D)`` and ``padding_mask (B, N)``."""
        cfg = self.cfg
        spec, valid_frames = self.frontend(wave, lengths)  # (B, n_mels, frames), (B,)
        x = self.patch_embed(spec.unsqueeze(1))  # (B, D, F', T')
        B, D, Fp, Tp = x.shape
        if Tp > cfg.max_time_tokens:
            raise ValueError(
                f"input of {Tp} time tokens is longer than max_seconds={cfg.max_seconds} covers "
                f"({cfg.max_time_tokens}); build the model with a larger max_seconds"
            )
        x = (x.permute(0, 3, 2, 1) + self.pos_embed[:, :Tp]).reshape(B, Tp * Fp, D)  # time-major tokens
        valid_time = valid_frames // self.frames_per_token  # (B,) tokens whose frames are all valid
        padded = torch.arange(Tp, device=x.device)[None, :] >= valid_time[:, None]  # (B, T')
        return x, padded.repeat_interleave(Fp, dim=1)  # (B, N, D), (B, N)

    def forward_features(self, wave: Tensor, lengths: Tensor | None = None) -> SpeechFeatures:
        """Waveform ``(B, T)`` (or ``(B, 1, T)``, ``(B, 1, 1, T)``) and valid samples ``lengths (B,)`` -> :class:`SpeechFeatures`."""
        x, padded = self.tokenize(wave, lengths)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        mask = nn.functional.pad(padded, (1, 0), value=False)  # the class token is never padded
        x = self.norm(self.blocks(x, key_padding_mask=mask))
        return SpeechFeatures(x[:, 1:], padded, x[:, 0])

    def pool(self, feats: SpeechFeatures) -> Tensor:
        """``(B, D)``: the class token, or the mean of the valid tokens."""
        if self.global_pool == "token":
            return feats.cls_token
        keep = (~feats.padding_mask).unsqueeze(-1).to(feats.frames.dtype)
        return (feats.frames * keep).sum(1) / keep.sum(1).clamp_min(1.0)

    def forward_head(self, feats: SpeechFeatures, pre_logits: bool = False) -> Tensor:
        x = self.head_drop(self.pool(feats))
        return x if pre_logits else self.head(x)

    def forward(self, wave: Tensor, lengths: Tensor | None = None) -> Tensor:
        """Waveform ``(B, T)`` and optional valid samples ``(B,)`` -> ``(B, num_classes)`` logits."""
        return self.forward_head(self.forward_features(wave, lengths))


# Architectures of the registered sizes; ``diff*`` and ``soft*`` names differ only in ``attn``.
SPEECH_CONFIGS: dict[str, dict[str, Any]] = {
    # The embedded default: D=64, 4 blocks, tokens of 2 frames (49 per second), ~0.2 M parameters,
    # trains in minutes on 2 CPU cores.
    "kwt_nano": dict(embed_dim=64, depth=4, baseline_heads=4, mlp_ratio=4.0, patch_time=2, time_mask_param=10),
    # KWT-1/2/3 (Berg et al.): one token per 10 ms frame of 40 mel bands, 12 blocks, MLP 4x.
    "kwt_1": dict(embed_dim=64, depth=12, baseline_heads=1, head_dim=32),
    "kwt_2": dict(embed_dim=128, depth=12, baseline_heads=2),
    "kwt_3": dict(embed_dim=192, depth=12, baseline_heads=3, head_dim=32),
    # AST-style 16x16 patches of a 128-band spectrogram (non-overlapping) at DeiT-Ti / DeiT-S widths.
    "ast_tiny_patch16": dict(n_mels=128, patch_freq=16, patch_time=16, embed_dim=192, depth=12, baseline_heads=3,
                             head_dim=32, freq_mask_param=24, time_mask_param=20, n_fft=1024, win_length=400),
    "ast_small_patch16": dict(n_mels=128, patch_freq=16, patch_time=16, embed_dim=384, depth=12, baseline_heads=6,
                              freq_mask_param=24, time_mask_param=20, n_fft=1024, win_length=400),
}
_PREFIX = {"kwt": ("diffkwt", "softkwt"), "ast": ("diffast", "softast")}


def _cfg(**kwargs: Any) -> dict[str, Any]:
    """timm pretrained config of a speech encoder.

    The input is a mono waveform at 16 kHz. timm's configs describe inputs as ``(C, H, W)``, so
    ``input_size=(1, 1, samples)``: one channel, a single row, one second by default (any length works,
    ``fixed_input_size=False``); :meth:`SpeechTransformer.forward` reads timm's ``(B, 1, 1, T)`` batch
    as well as ``(B, T)``. The model normalises its log-mel features itself (``mel_mean`` /
    ``mel_std``), so the waveform gets no normalisation outside it: mean 0, std 1.
    """
    return {"url": "", "num_classes": 12, "input_size": (1, 1, 16000), "fixed_input_size": False,
            "mean": (0.0,), "std": (1.0,), "crop_pct": 1.0, "pool_size": None,
            "first_conv": "patch_embed", "classifier": "head", "license": "apache-2.0", **kwargs}


def speech_model_names(prefix: str | None = None) -> list[str]:
    """Registered speech model names, optionally only those starting with ``prefix`` (``"diff"``, ``"soft"``)."""
    names = [f"{p}_{size.split('_', 1)[1]}" for size in SPEECH_CONFIGS for p in _PREFIX[size.split("_", 1)[0]]]
    return [n for n in names if prefix is None or n.startswith(prefix)]


def _size_of(name: str) -> str:
    prefix, rest = name.split("_", 1)
    family = prefix[4:]  # diffkwt -> kwt, softast -> ast
    size = f"{family}_{rest}"
    if prefix[:4] not in ("diff", "soft") or size not in SPEECH_CONFIGS:
        raise ValueError(f"{name!r} is not a diffzoo speech model; expected one of {speech_model_names()}")
    return size


def matched_speech_name(name: str) -> str:
    """The matched partner: ``diffkwt_1`` <-> ``softkwt_1``, ``diffast_x`` <-> ``softast_x``."""
    _size_of(name)
    return ("soft" if name.startswith("diff") else "diff") + name[4:]


def _create(variant: str, pretrained: bool, **kwargs: Any) -> SpeechTransformer:
    arch = dict(SPEECH_CONFIGS[_size_of(variant)], attn="diff" if variant.startswith("diff") else "softmax")
    arch.update(current_names(kwargs, SPEECH_RENAMED))
    if get_spec(arch["attn"]).kind != "diff" and "head_dim" not in kwargs:
        arch.pop("head_dim", None)
    return build_model_with_cfg(SpeechTransformer, variant, pretrained, **arch)


default_cfgs = generate_default_cfgs({name: _cfg() for name in speech_model_names()})


@register_model
def diffkwt_nano(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """Differential keyword transformer for the embedded default (D=64, 4 blocks, 2 heads of width 16)."""
    return _create("diffkwt_nano", pretrained, **kwargs)


@register_model
def softkwt_nano(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """Softmax baseline of :func:`diffkwt_nano` (4 heads of width 16)."""
    return _create("softkwt_nano", pretrained, **kwargs)


@register_model
def diffkwt_1(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """Differential KWT-1 (D=64, 12 blocks, 1 differential head of width 32)."""
    return _create("diffkwt_1", pretrained, **kwargs)


@register_model
def softkwt_1(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """KWT-1 with softmax attention (1 head of width 64)."""
    return _create("softkwt_1", pretrained, **kwargs)


@register_model
def diffkwt_2(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """Differential KWT-2 (D=128, 12 blocks, 1 differential head of width 64)."""
    return _create("diffkwt_2", pretrained, **kwargs)


@register_model
def softkwt_2(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """KWT-2 with softmax attention (2 heads of width 64)."""
    return _create("softkwt_2", pretrained, **kwargs)


@register_model
def diffkwt_3(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """Differential KWT-3 (D=192, 12 blocks, 3 differential heads of width 32)."""
    return _create("diffkwt_3", pretrained, **kwargs)


@register_model
def softkwt_3(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """KWT-3 with softmax attention (3 heads of width 64)."""
    return _create("softkwt_3", pretrained, **kwargs)


@register_model
def diffast_tiny_patch16(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """Differential AST-style encoder, 16x16 patches, DeiT-Ti width (3 differential heads of width 32)."""
    return _create("diffast_tiny_patch16", pretrained, **kwargs)


@register_model
def softast_tiny_patch16(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """Softmax baseline of :func:`diffast_tiny_patch16` (3 heads of width 64)."""
    return _create("softast_tiny_patch16", pretrained, **kwargs)


@register_model
def diffast_small_patch16(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """Differential AST-style encoder, 16x16 patches, DeiT-S width (3 differential heads of width 64)."""
    return _create("diffast_small_patch16", pretrained, **kwargs)


@register_model
def softast_small_patch16(pretrained: bool = False, **kwargs: Any) -> SpeechTransformer:
    """Softmax baseline of :func:`diffast_small_patch16` (6 heads of width 64)."""
    return _create("softast_small_patch16", pretrained, **kwargs)
