"""diffzoo.data.speech / synth: espeak-ng synthesis, voice-disjoint splits, Speech Commands on a tiny tree."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from diffzoo.data import synth
from diffzoo.data.speech import (
    AudioError,
    SoundfileSpeechCommands,
    SpeechCommandsDataModule,
    SpeechCommandsKeywords,
    SynthKeywordDataset,
    collate_audio,
    fit_length,
    load_audio,
)
from diffzoo.data.synth import KEYWORDS, SILENCE, UNKNOWN, Espeak, SynthConfig, class_names, load_or_synthesize

# Ten keywords and two other words: the smallest vocabulary that has every 12-class label.
TINY_WORDS = (*KEYWORDS, "bed", "cat")


def tiny_synth_config(per_word: tuple[int, int, int] = (3, 1, 1)) -> SynthConfig:
    return SynthConfig(words=TINY_WORDS, clips_per_word=per_word, silence_clips=per_word)


def _tone(seconds: float, rate: int = 16000, freq: float = 440.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * freq * t).astype(np.float32)
    return np.stack([wave] * channels, 1) if channels > 1 else wave


def make_speech_commands(root: Path, nested: bool = True) -> Path:
    """A tiny Speech Commands v2 tree with official list files, a corrupt clip and odd formats.

    Returns the folder to pass as ``data_dir``. Speakers ``s0..s3``: ``s1`` is in the validation list,
    ``s2`` in the testing list (as the real lists, whole speakers go to one split).
    """
    base = root / "SpeechCommands" / "speech_commands_v0.02" if nested else root / "speech_commands_v0.02"
    words = ("yes", "no", "left", "bed", "cat", "dog")
    val, test = [], []
    for wi, word in enumerate(words):
        (base / word).mkdir(parents=True)
        for s in range(4):
            name = f"{word}/s{s}_nohash_0.wav"
            sf.write(base / name, _tone(0.8 if s == 3 else 1.0, freq=200.0 + 50 * wi), 16000, subtype="PCM_16")
            (val if s == 1 else test if s == 2 else []).append(name)
    (base / "validation_list.txt").write_text("\n".join(val) + "\n")
    (base / "testing_list.txt").write_text("\n".join(test) + "\n")
    # odd training files: stereo at 44.1 kHz (converted), a corrupt file and an empty one (skipped)
    sf.write(base / "yes/s5_nohash_0.wav", _tone(1.0, rate=44100, channels=2), 44100)
    (base / "no/s6_nohash_0.wav").write_bytes(b"RIFF\x00\x00\x00\x00not really a wave file")
    sf.write(base / "left/s7_nohash_0.wav", np.zeros(0, dtype=np.float32), 16000)
    (base / "_background_noise_").mkdir()
    sf.write(base / "_background_noise_/white_noise.wav",
             (0.5 * np.random.default_rng(0).standard_normal(40000)).astype(np.float32), 16000)
    return root if nested else base


# -- synthesis ------------------------------------------------------------------------------------
def test_espeak_speaks_words_at_its_rate() -> None:
    engine = Espeak.get()
    assert engine.sample_rate == 22050 == synth.ESPEAK_RATE
    clip = engine.speak("yes", accent="en-us", variant="f3", rate=200, pitch=60)
    assert clip.dtype == np.int16 and 0.1 * 22050 < len(clip) < 1.5 * 22050
    assert np.abs(clip).max() > 3000  # audible, not silence
    slow = engine.speak("yes", accent="en-us", variant="f3", rate=100, pitch=60)
    assert len(slow) > len(clip)  # the rate parameter reaches the engine
    with pytest.raises(ValueError, match="unknown espeak-ng voice variant"):
        engine.speak("yes", variant="no-such-voice")
    assert len(synth.espeak_variants()) > 60


def test_synthesised_set_is_voice_disjoint_non_silent_and_cached(tmp_path: Path, monkeypatch) -> None:
    cfg = tiny_synth_config()
    data = load_or_synthesize(cfg, tmp_path, show_progress=False)
    voices = data["voices"]
    assert not set(voices["train"]) & set(voices["val"]) and not set(voices["train"]) & set(voices["test"])
    assert not set(voices["val"]) & set(voices["test"])
    assert sorted(voices["train"] + voices["val"] + voices["test"]) == synth.espeak_variants()
    for split, n in zip(synth.SPLITS, cfg.clips_per_word):
        part = data[split]
        assert part["waves"].shape == (len(TINY_WORDS) * n + cfg.silence_clips[synth.SPLITS.index(split)], 16000)
        assert part["waves"].dtype == torch.int16
        spoken = part["words"] >= 0
        peaks = part["waves"].float().abs().amax(1)
        assert (peaks[spoken] > 10000).all() and (peaks[~spoken] == 0).all()  # words are loud, silence empty
        assert ((part["waves"][spoken] != 0).sum(1) > 800).all()  # at least 50 ms of sound at 16 kHz
        assert (part["voices"][spoken] >= 0).all() and (part["voices"][spoken] < len(voices[split])).all()
    # a second call reads the cache: synthesis would fail now
    monkeypatch.setattr(Espeak, "speak", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-synthesised")))
    again = load_or_synthesize(cfg, tmp_path, show_progress=False)
    assert torch.equal(again["train"]["waves"], data["train"]["waves"])
    # a truncated cache file (a killed run) is made again, not a crash
    cache = next(tmp_path.glob("synth_keywords_*.pt"))
    cache.write_bytes(cache.read_bytes()[:100])
    monkeypatch.undo()
    # made again in a fresh process with seeded noise: the same samples, although this process's engine has
    # spoken since (espeak-ng keeps state between utterances that no call resets)
    Espeak.get().speak("seven", variant="whisperf")
    remade = load_or_synthesize(cfg, tmp_path, show_progress=False)
    for split in synth.SPLITS:
        for key in ("waves", "words", "voices"):
            assert torch.equal(remade[split][key], data[split][key]), (split, key)


def test_a_set_made_by_another_program_is_the_same_and_a_failed_synthesis_says_so(tmp_path: Path) -> None:
    """A script with no ``if __name__ == "__main__"`` guard synthesises the same set as this process does."""
    import subprocess
    import sys

    cfg = tiny_synth_config()
    here = load_or_synthesize(cfg, tmp_path / "here", show_progress=False)
    script = ("from diffzoo.data.synth import SynthConfig, load_or_synthesize\n"
              f"load_or_synthesize(SynthConfig(words={TINY_WORDS!r}, clips_per_word=(3, 1, 1), "
              f"silence_clips=(3, 1, 1)), {str(tmp_path / 'there')!r}, show_progress=False)\n")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, timeout=600)
    there = torch.load(next((tmp_path / "there").glob("synth_keywords_*.pt")), weights_only=True)
    assert all(torch.equal(here[s]["waves"], there[s]["waves"]) for s in synth.SPLITS)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(RuntimeError, match="failed in its own process"):
        load_or_synthesize(cfg, tmp_path / "a-file" / "cache", show_progress=False)


def test_synthesis_is_seeded_and_depends_on_the_engines_history() -> None:
    """What the fresh process in load_or_synthesize is for: one engine, the same seed, the same utterance twice
    gives different samples (state carried over), and a whispered voice's noise follows the seed."""
    engine = Espeak.get()
    first = engine.speak("yes", accent="en-us", variant="whisperf", seed=11)
    second = engine.speak("yes", accent="en-us", variant="whisperf", seed=11)
    assert not np.array_equal(first, second)
    assert synth.clip_seed(0, "val", 3, 0) != synth.clip_seed(0, "val", 3, 1) != synth.clip_seed(0, "test", 3, 1)
    assert 0 <= synth.clip_seed(5, "train", 10**6, 7) < 2**31


def test_synth_dataset_labels_noise_and_determinism(tmp_path: Path) -> None:
    cfg = tiny_synth_config((4, 2, 2))
    data = load_or_synthesize(cfg, tmp_path, show_progress=False)
    names = class_names(12)
    train = SynthKeywordDataset(data["train"], cfg.words, "train", num_classes=12)
    counts = np.bincount(train.labels, minlength=12)
    assert counts.tolist() == [4] * 12  # unknown words subsampled to one keyword's count; silence too
    val = SynthKeywordDataset(data["val"], cfg.words, "val", num_classes=12)
    wave, label, length = val[0]
    assert wave.shape == (16000,) and length == 16000 and names[label] == "yes"
    assert torch.equal(val[0][0], wave)  # evaluation noise is fixed per clip
    wave.zero_()  # a caller's copy: the clip the split keeps is unchanged, and is what a fresh split renders
    fresh = SynthKeywordDataset(data["val"], cfg.words, "val", num_classes=12)
    assert torch.equal(val[0][0], fresh[0][0]) and bool(val[0][0].any())
    wave = val[0][0]
    clean = data["val"]["waves"][val.rows[0]].float() / 32767
    assert (wave - clean).abs().mean() > 1e-3  # noise was mixed in
    silence = next(i for i, y in enumerate(val.labels) if names[y] == SILENCE)
    assert 1e-4 < val[silence][0].pow(2).mean().sqrt() < 0.2
    torch.manual_seed(0)
    a = train[0][0]
    assert not torch.equal(a, train[0][0])  # training draws fresh noise / gain / shift
    full = SynthKeywordDataset(data["test"], cfg.words, "test", num_classes=35)
    assert len(full) == len(TINY_WORDS) * 2 and SILENCE not in [class_names(35)[y] for y in full.labels]


def test_fixed_snr_sets_the_noise_of_every_split(tmp_path: Path) -> None:
    from diffzoo.data.speech import SynthKeywordsDataModule

    def module(snr):
        dm = SynthKeywordsDataModule(clips_per_word=(1, 1, 1), silence_clips=(1, 1, 1), cache_dir=str(tmp_path),
                                     snr_fixed_db=snr)
        dm.setup("fit")
        return dm

    ranged, loud, quiet = module(None), module(20.0), module(-10.0)
    assert ranged.val_set.snr_db == (0.0, 20.0)
    for split in ("train_set", "val_set", "test_set"):
        assert getattr(loud, split).snr_db == (20.0, 20.0) and getattr(quiet, split).snr_db == (-10.0, -10.0)
    spoken = next(i for i in range(len(loud.val_set)) if class_names(12)[loud.val_set.labels[i]] != SILENCE)
    a, b = loud.val_set[spoken][0], quiet.val_set[spoken][0]  # same clip, gain, shift and noise draw
    # speech power P plus noise power P/100 at +20 dB and 10 P at -10 dB: about 11 times the power
    assert 8 < float(b.pow(2).mean() / a.pow(2).mean()) < 14


def test_colored_noise_has_the_distribution_of_filtered_white_noise() -> None:
    """Drawing the spectrum directly gives what shaping the FFT of white noise gives: the mean power of every
    bin, the DC and Nyquist bins (real, twice the variance) included, over many draws of either length parity."""
    def filtered(n: int, beta: float, gen: torch.Generator) -> torch.Tensor:
        spectrum = torch.fft.rfft(torch.randn(n, generator=gen))
        noise = torch.fft.irfft(spectrum / torch.arange(n // 2 + 1).clamp_min(1) ** (beta / 2), n=n)
        return noise / noise.pow(2).mean().sqrt()

    gen = torch.Generator().manual_seed(0)
    for n in (64, 63):
        for beta in (0.0, 1.5):
            power = {name: torch.stack([torch.fft.rfft(f(n, beta, gen)).abs().pow(2) for _ in range(4000)]).mean(0)
                     for name, f in (("direct", synth.colored_noise), ("filtered", filtered))}
            # each bin's mean over 4,000 draws: a chi-square mean's relative error is about 2-3 %
            ratio = power["direct"] / power["filtered"]
            assert (ratio - 1).abs().max() < 0.12, (n, beta, ratio)
            assert abs(float(ratio[0]) - 1) < 0.12 and abs(float(ratio[-1]) - 1) < 0.12


def test_colored_noise_and_mixing() -> None:
    gen = torch.Generator().manual_seed(0)
    white, brown = synth.colored_noise(16000, 0.0, gen), synth.colored_noise(16000, 2.0, gen)
    assert white.pow(2).mean().sqrt() == pytest.approx(1.0, rel=1e-4)
    # brown noise keeps most power at low frequencies, white noise spreads it out
    low = lambda x: torch.fft.rfft(x).abs().pow(2)[:400].sum() / torch.fft.rfft(x).abs().pow(2).sum()  # noqa: E731
    assert low(brown) > 0.9 > 0.2 > low(white)
    signal = torch.sin(torch.arange(16000) * 0.1)
    mixed = synth.mix_noise(signal, white, snr_db=10.0)
    snr = 10 * math.log10(signal.pow(2).mean() / (mixed - signal).pow(2).mean())
    assert snr == pytest.approx(10.0, abs=1e-3)
    # the scale is torchaudio's (SNR from the energies); a silent noise segment adds nothing instead of NaN
    expected = signal + white * (signal.pow(2).mean() / white.pow(2).mean()).sqrt() * 10 ** (-10.0 / 20)
    assert torch.allclose(mixed, expected, atol=1e-6)
    assert torch.equal(synth.mix_noise(signal, torch.zeros(16000), snr_db=10.0), signal)


# -- reading audio --------------------------------------------------------------------------------
def test_load_audio_converts_or_explains(tmp_path: Path) -> None:
    sf.write(tmp_path / "stereo.wav", _tone(0.5, rate=8000, channels=2), 8000)
    wave = load_audio(tmp_path / "stereo.wav", 16000)
    assert wave.shape == (8000,)  # mono, resampled to 16 kHz
    (tmp_path / "bad.wav").write_bytes(b"garbage")
    with pytest.raises(AudioError, match="cannot read audio file .*bad.wav"):
        load_audio(tmp_path / "bad.wav", 16000)
    sf.write(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32), 16000)
    with pytest.raises(AudioError, match="holds no samples"):
        load_audio(tmp_path / "empty.wav", 16000)
    with pytest.raises(AudioError, match="cannot read"):
        load_audio(tmp_path / "missing.wav", 16000)
    assert fit_length(torch.ones(10), 16).tolist() == [1.0] * 10 + [0.0] * 6
    assert fit_length(torch.arange(20.0), 10).tolist() == list(range(5, 15))
    waves, labels, lengths = collate_audio([(torch.ones(5), 1, 5), (torch.ones(3), 2, 3)])
    assert waves.shape == (2, 5) and lengths.tolist() == [5, 3] and waves[1, 3:].abs().sum() == 0


# -- Speech Commands ------------------------------------------------------------------------------
def test_soundfile_speech_commands_follows_the_official_lists(tmp_path: Path) -> None:
    root = make_speech_commands(tmp_path)
    val = SoundfileSpeechCommands(root, "validation")
    assert len(val) == 6 and {val.get_metadata(i)[3] for i in range(len(val))} == {"s1"}
    test = SoundfileSpeechCommands(root, "testing")
    assert {test.get_metadata(i)[3] for i in range(len(test))} == {"s2"}
    train = SoundfileSpeechCommands(root, "training")
    assert {train.get_metadata(i)[3] for i in range(len(train))} == {"s0", "s3", "s5", "s6", "s7"}
    wave, rate, label, speaker, utterance = val[0]  # torchaudio's tuple, read without FFmpeg
    assert wave.shape == (1, 16000) and rate == 16000 and speaker == "s1" and utterance == 0
    # the extracted archive itself works as data_dir too
    flat = make_speech_commands(tmp_path / "flat", nested=False)
    assert len(SoundfileSpeechCommands(flat, "validation")) == 6
    with pytest.raises(FileNotFoundError, match="no Speech Commands v2"):
        SoundfileSpeechCommands(tmp_path / "nowhere")
    (flat / "testing_list.txt").unlink()
    with pytest.raises(FileNotFoundError, match="testing_list.txt is missing"):
        SoundfileSpeechCommands(flat, "training")


def test_twelve_class_mapping_silence_unknown_and_bad_files(tmp_path: Path, caplog) -> None:
    root = make_speech_commands(tmp_path)
    names = class_names(12)
    val = SpeechCommandsKeywords(root, "val", num_classes=12, unknown_percentage=50.0, silence_percentage=50.0)
    labels = [names[y] for _, y in val.items]
    # 3 keyword clips (yes/no/left of s1) -> ceil(50 %) = 2 unknown of the 3 others, 2 silence
    assert sorted(labels) == sorted(["yes", "no", "left", UNKNOWN, UNKNOWN, SILENCE, SILENCE])
    for i in range(len(val)):
        wave, y, length = val[i]
        assert wave.shape == (16000,) and length == 16000
        assert torch.equal(wave, val[i][0])  # evaluation items are deterministic
        if names[y] == SILENCE:
            assert 0 < wave.abs().max() <= 0.5 * 0.1 * 6  # background noise at most noise_volume loud
    train = SpeechCommandsKeywords(root, "train", num_classes=12, noise_prob=1.0)
    keyword_files = [train.source.get_metadata(n)[0] for n, y in train.items if n >= 0 and names[y] in KEYWORDS]
    assert len(keyword_files) == 3 * 2 + 3  # yes/no/left of s0 and s3, plus the three odd files
    with caplog.at_level("WARNING", logger="diffzoo.data"):
        batch = [train[i] for i in range(len(train))]
    assert train.num_bad == 2  # the corrupt and the empty file were skipped, counted and logged
    assert "s6_nohash_0.wav" in caplog.text and "s7_nohash_0.wav" in caplog.text
    assert all(w.shape == (16000,) and torch.isfinite(w).all() for w, _, _ in batch)
    full = SpeechCommandsKeywords(root, "test", num_classes=35)
    assert sorted(class_names(35)[y] for _, y in full.items) == ["bed", "cat", "dog", "left", "no", "yes"]


def test_variable_length_clips_keep_their_lengths(tmp_path: Path) -> None:
    root = make_speech_commands(tmp_path)
    train = SpeechCommandsKeywords(root, "train", num_classes=35, clip_seconds=None, noise_prob=0.0,
                                   time_shift_ms=0.0)
    lengths = sorted({train[i][2] for i in range(len(train))})
    assert lengths == [12800, 16000]  # speaker s3 recorded 0.8 s clips
    dm = SpeechCommandsDataModule(str(root), num_classes=12, batch_size=4, num_workers=0)
    dm.setup("fit")
    waves, labels, lens = next(iter(dm.train_dataloader()))
    assert waves.shape == (4, 16000) and labels.dtype == torch.long and lens.tolist() == [16000] * 4
    assert dm.num_classes == 12 and dm.num_bad >= 0
