"""diffzoo.models.speech: registered models, matched baselines, front end, masks, padding invariance."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

from diffzoo.layers import DiffAttention, check_matched, count_parameters
from diffzoo.layers.attention import Attention
from diffzoo.models import speech
from diffzoo.models.speech import (
    SPEECH_CONFIGS,
    SpeechEncoderConfig,
    SpeechTransformer,
    matched_speech_name,
    num_frames,
    speech_model_names,
)

ALL = speech_model_names()


def _tiny(**kw) -> SpeechTransformer:
    """A 2-block model with differential attention (frame tokens of 2 frames, D=32)."""
    args = dict(embed_dim=32, depth=2, num_heads=4, patch_time=2, num_classes=5)
    args.update(kw)
    return SpeechTransformer(**args).eval()


def test_registry_names_and_partners() -> None:
    assert len(ALL) == 2 * len(SPEECH_CONFIGS)
    assert set(ALL) == set(timm.list_models("diffkwt_*") + timm.list_models("softkwt_*")
                           + timm.list_models("diffast_*") + timm.list_models("softast_*"))
    assert matched_speech_name("diffkwt_1") == "softkwt_1"
    assert matched_speech_name("softast_tiny_patch16") == "diffast_tiny_patch16"
    with pytest.raises(ValueError, match="not a diffzoo speech model"):
        matched_speech_name("diffvit_nano_patch7_28")


@pytest.mark.parametrize("name", ALL)
def test_registered_model_forward_backward(name: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7, depth=1)  # one block keeps the big sizes fast
    model.train()
    wave = 0.1 * torch.randn(2, 16000)
    out = model(wave, torch.tensor([16000, 9000]))
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"parameters without a finite gradient: {missing[:5]}"
    zero = [n for n, p in model.named_parameters() if p.grad.abs().sum() == 0]
    assert not zero, f"parameters with an all-zero gradient: {zero[:5]}"


def _params_at_full_depth(name: str) -> tuple[SpeechTransformer, int]:
    """A 1-block copy of ``name`` and the parameter count of the registered depth.

    The count is affine in depth (identical blocks), so two shallow models give it exactly without
    building the 12-block ones.
    """
    one, two = timm.create_model(name, depth=1), timm.create_model(name, depth=2)
    per_block = count_parameters(two) - count_parameters(one)
    return one, count_parameters(one) + (SPEECH_CONFIGS[speech._size_of(name)]["depth"] - 1) * per_block


@pytest.mark.parametrize("name", speech_model_names("diff"))
def test_differential_models_match_their_softmax_baseline(name: str) -> None:
    diff, n_diff = _params_at_full_depth(name)
    base, n_base = _params_at_full_depth(matched_speech_name(name))
    assert isinstance(diff.blocks[0].attn, DiffAttention) and type(base.blocks[0].attn) is Attention
    assert abs(n_diff - n_base) / n_base < 0.005
    check_matched(base, diff)  # the 1-block models match too
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert getattr(diff.blocks[0].attn, proj).weight.shape == getattr(base.blocks[0].attn, proj).weight.shape
    # only lambda vectors (4d) and the per-head norm (2d) are extra
    depth = SPEECH_CONFIGS[speech._size_of(name)]["depth"]
    assert n_diff - n_base == depth * 6 * diff.blocks[0].attn.head_dim


def test_kwt_sizes_and_lambda_schedule() -> None:
    kwt1, soft1 = timm.create_model("diffkwt_1", num_classes=12), timm.create_model("softkwt_1", num_classes=12)
    assert kwt1.blocks[0].attn.num_heads == 1 and kwt1.blocks[0].attn.head_dim == 32
    assert soft1.blocks[0].attn.num_heads == 1
    assert 600_000 < count_parameters(soft1) < 620_000  # KWT-1 has 607 K with 40 MFCCs and 98 frames
    inits = [b.attn.lambda_init for b in kwt1.blocks]
    assert inits[0] == pytest.approx(0.2) and inits == sorted(inits)


def test_frontend_shapes_masks_and_specaugment() -> None:
    torch.manual_seed(0)
    model = _tiny(global_pool="avg")
    cfg = model.cfg
    wave = 0.1 * torch.randn(3, 16000)
    lengths = torch.tensor([16000, 8000, 300])  # the last clip is shorter than one window
    spec, valid = model.frontend(wave, lengths)
    assert spec.shape == (3, cfg.n_mels, num_frames(16000, cfg.n_fft, cfg.hop_length)) == (3, 40, 98)
    assert valid.tolist() == [98, 48, 0]
    feats = model.forward_features(wave, lengths)
    assert feats.frames.shape == (3, 49, 32) and feats.cls_token.shape == (3, 32)
    assert feats.padding_mask.sum(1).tolist() == [0, 49 - 24, 49]
    out = model(wave, lengths)
    assert torch.isfinite(out).all()  # a clip with no valid token still gives finite logits
    # SpecAugment only in training: eval is deterministic, training masks whole bands and frame spans
    assert torch.equal(model.frontend(wave)[0], model.frontend(wave)[0])
    model.train()
    masked = model.frontend(wave)[0]
    assert not torch.equal(masked, spec)
    assert ((masked == 0).all(dim=2).any(dim=1) | (masked == 0).all(dim=1).any(dim=1)).all()


def test_power_spectrum_is_torchaudios() -> None:
    """The frontend's |STFT|^2 (a sum of squares) against torchaudio's Spectrogram with the same settings."""
    model = _tiny(global_pool="avg").eval()
    wave = 0.1 * torch.randn(2, 16000, generator=torch.Generator().manual_seed(0))
    ours = model.frontend._power_spectrum(wave)
    theirs = model.frontend.mel.spectrogram(wave)
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=1e-5, atol=1e-9 * float(theirs.max()))


@pytest.mark.parametrize("num_samples", [880, 1000, 4000, 8000])
def test_framing_gives_token_counts_and_times(num_samples: int) -> None:
    model = _tiny(patch_time=3, hop_length=200, max_seconds=1.0)
    cfg = model.cfg
    x, padded = model.tokenize(torch.randn(2, num_samples), torch.tensor([num_samples, num_samples // 2]))
    assert x.shape[1] == model.num_tokens(num_samples) == model.time_tokens(num_samples) * cfg.freq_tokens
    valid = model.valid_time_tokens(torch.tensor([num_samples, num_samples // 2]))
    assert (~padded).sum(1).tolist() == (valid * cfg.freq_tokens).tolist()
    assert model.frames_per_token == 3
    times = model.token_times(num_samples)  # token t reads frames 3t .. 3t + 2: samples 600t .. 600t + 400 + 480
    assert times.shape == (model.time_tokens(num_samples), 2)
    assert times[0].tolist() == pytest.approx([0.0, (2 * 200 + 480) / 16000])
    if len(times) > 1:
        assert float(times[1, 0] - times[0, 0]) == pytest.approx(3 * 200 / 16000)
    if num_samples >= cfg.n_fft:  # the last full token ends inside the clip
        assert float(times[-1, 1]) <= num_samples / 16000


def test_two_dimensional_patches_are_time_major() -> None:
    model = _tiny(n_mels=32, patch_freq=8, patch_time=4).eval()
    feats = model.forward_features(0.1 * torch.randn(2, 16000), torch.tensor([16000, 8000]))
    assert feats.frames.shape == (2, 24 * 4, 32)  # 98 frames // 4 = 24 time steps x 4 frequency patches
    # 8000 samples -> 48 frames -> 12 valid time steps -> 48 valid tokens, the first ones
    assert (~feats.padding_mask[1]).sum() == 48 and not feats.padding_mask[1, :48].any()


@pytest.mark.parametrize("attn,pool,patch", [("diff", "token", {}), ("softmax", "avg", {}),
                                             ("diff", "avg", dict(n_mels=32, patch_freq=8, patch_time=4))])
def test_padding_does_not_change_valid_features(attn: str, pool: str, patch: dict) -> None:
    torch.manual_seed(0)
    model = _tiny(attn=attn, global_pool=pool, **patch)
    clip = 0.1 * torch.randn(1, 11000)
    alone = model.forward_features(clip)
    padded = torch.cat([clip, 0.3 * torch.randn(1, 5000)], dim=1)  # the padding is not even silence
    batch = model.forward_features(padded, torch.tensor([11000]))
    n = alone.frames.shape[1]
    assert not batch.padding_mask[0, :n].any() and batch.padding_mask[0, n:].all()
    torch.testing.assert_close(batch.frames[:, :n], alone.frames, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(padded, torch.tensor([11000])), model(clip), atol=1e-5, rtol=1e-5)
    # without the lengths the padding leaks into the valid tokens: the mask is what makes them equal
    unmasked = model.forward_features(padded)
    assert (unmasked.frames[:, :n] - alone.frames).abs().max() > 1e-4


def test_features_feed_a_ctc_head() -> None:
    torch.manual_seed(0)
    model = _tiny(num_classes=0)
    feats = model.forward_features(0.1 * torch.randn(2, 16000), torch.tensor([16000, 12000]))
    log_probs = torch.nn.Linear(32, 6)(feats.frames).log_softmax(-1).transpose(0, 1)  # (N, B, vocab)
    input_lengths = (~feats.padding_mask).sum(1)
    assert input_lengths.tolist() == [49, 36]
    loss = F.ctc_loss(log_probs, torch.tensor([[1, 2, 3], [4, 5, 0]]), input_lengths, torch.tensor([3, 2]))
    assert torch.isfinite(loss)
    assert model(0.1 * torch.randn(2, 16000)).shape == (2, 32)  # num_classes=0: pooled features


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="mono"):
        SpeechTransformer(in_chans=2)
    with pytest.raises(TypeError, match="unknown SpeechTransformer argument"):
        SpeechTransformer(img_size=224)
    with pytest.raises(ValueError, match="patch_freq"):
        SpeechEncoderConfig(n_mels=40, patch_freq=16)
    with pytest.raises(ValueError, match="max_seconds"):
        _tiny()(torch.zeros(1, 32000))
    longer = _tiny(max_seconds=2.0)
    assert longer(torch.zeros(1, 32000)).shape == (1, 5)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        _tiny()(torch.zeros(16000))
