"""Keyword-spotting data: Google Speech Commands v2 and the synthesised embedded default.

* :class:`SoundfileSpeechCommands` is torchaudio's ``SPEECHCOMMANDS`` (official ``validation_list.txt`` /
  ``testing_list.txt`` splits) reading audio with ``soundfile``, so no system FFmpeg is needed.
* :class:`SpeechCommandsKeywords` maps it to the 12-class task (10 keywords, ``_unknown_``, ``_silence_``,
  as TensorFlow's ``input_data.py``: unknown and silence each a percentage of the keyword clips) or the
  35-class task, pads / crops to 1 s, and mixes in the data set's ``_background_noise_`` recordings.
* :class:`SynthKeywordDataset` serves the espeak-ng keywords of :mod:`diffzoo.data.synth`.

Audio is checked when read (:func:`load_audio`): multi-channel files are mixed down and other sample
rates resampled (logged once); unreadable, empty or non-finite files raise :class:`AudioError`, and a
data set skips such a file, logs it and counts it once in ``num_bad``; a training split serves the next clip
instead, an evaluation split leaves it out (its loaders are :class:`~diffzoo.data.skipping.EvalDataLoader`).
Batches are ``(waveform (B, T) float, label (B,) int64, length (B,) valid samples)``. The evaluation splits
describe each clip with ``clip_info(index)`` (its voice or speaker, and the SNR its noise was mixed at), which
the per-clip test file (``test_clips.csv``, :class:`~diffzoo.tasks.callbacks.TestClipsCSV`) records.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from .modules import check_train_loader, epoch_sampler
from .skipping import EvalDataLoader, SkipsBadItems
from .synth import (
    KEYWORDS,
    SILENCE,
    SPLITS,
    UNKNOWN,
    SynthConfig,
    class_names,
    colored_noise,
    load_or_synthesize,
    mix_noise,
)

log = logging.getLogger("diffzoo.data")

BACKGROUND_NOISE_DIR = "_background_noise_"
_SUBSETS = {"train": "training", "val": "validation", "test": "testing"}


class AudioError(ValueError):
    """An audio file that cannot be used (unreadable, empty, non-finite samples)."""


_warned: set[str] = set()


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        log.warning("%s (further files like this are converted silently)", message)


def load_audio(path: str | os.PathLike, sample_rate: int) -> Tensor:
    """Read a mono float32 waveform ``(T,)`` at ``sample_rate`` with ``soundfile``.

    Multi-channel audio is averaged to mono and other rates are resampled (each logged once).
    Raises :class:`AudioError` for a file that cannot be read, holds no samples or has NaN/inf samples.
    """
    import soundfile as sf

    try:
        data, rate = sf.read(os.fspath(path), dtype="float32", always_2d=True)  # (T, C)
    except (sf.SoundFileError, RuntimeError, OSError, ValueError) as e:
        raise AudioError(f"cannot read audio file {path}: {e}") from e
    if data.shape[0] == 0:
        raise AudioError(f"audio file {path} holds no samples")
    if not np.isfinite(data).all():
        raise AudioError(f"audio file {path} has NaN or infinite samples")
    wave = torch.from_numpy(data)
    if wave.shape[1] > 1:
        _warn_once("channels", f"{path} has {wave.shape[1]} channels; mixing down to mono")
        wave = wave.mean(1)
    else:
        wave = wave[:, 0]
    if rate != sample_rate:
        import torchaudio

        _warn_once(f"rate{rate}", f"{path} is sampled at {rate} Hz; resampling to {sample_rate} Hz")
        wave = torchaudio.functional.resample(wave, rate, sample_rate)
    return wave


def fit_length(wave: Tensor, num_samples: int, random_crop: bool = False) -> Tensor:
    """Zero-pad (at the end) or crop ``(T,)`` to ``num_samples``; the crop is random or centred."""
    if len(wave) < num_samples:
        return torch.nn.functional.pad(wave, (0, num_samples - len(wave)))
    extra = len(wave) - num_samples
    start = int(torch.randint(0, extra + 1, (1,))) if random_crop else extra // 2
    return wave[start : start + num_samples]


def time_shift(wave: Tensor, max_shift: int, generator: torch.Generator | None = None) -> Tensor:
    """Shift ``(T,)`` by up to ``max_shift`` samples either way, filling with zeros."""
    if max_shift <= 0:
        return wave
    s = int(torch.randint(-max_shift, max_shift + 1, (1,), generator=generator))
    out = torch.zeros_like(wave)
    if s >= 0:
        out[s:] = wave[: len(wave) - s]
    else:
        out[:s] = wave[-s:]
    return out


def _eval_generator(*keys: int | str) -> torch.Generator:
    """A generator seeded from ``keys``: evaluation clips get the same noise in every run."""
    return torch.Generator().manual_seed(zlib.crc32(repr(keys).encode()))


def collate_audio(batch: Sequence[tuple[Tensor, int, int]]) -> tuple[Tensor, Tensor, Tensor]:
    """``[(wave (T_i,), label, length)]`` -> zero-padded ``(B, max T)``, labels ``(B,)``, lengths ``(B,)``."""
    longest = max(len(b[0]) for b in batch)
    waves = torch.zeros(len(batch), longest)
    for i, b in enumerate(batch):
        waves[i, : len(b[0])] = b[0]
    labels = torch.as_tensor([int(b[1]) for b in batch], dtype=torch.long)
    lengths = torch.as_tensor([int(b[2]) for b in batch], dtype=torch.long)
    return waves, labels, lengths


class _SkipsBadAudio(SkipsBadItems):
    """Skips clips raising :class:`AudioError`, each counted once across workers.

    Subclasses implement ``get(index)`` and call ``init_skipping(len(self), substitute=training)``.
    """

    read_errors = (AudioError,)
    bad_noun = "unusable audio files"

    def get(self, index: int) -> tuple[Tensor, int, int]:
        raise NotImplementedError

    def read(self, index: int) -> tuple[Tensor, int, int]:
        return self.get(index)


# -- Google Speech Commands -----------------------------------------------------------------------
def _torchaudio_layout(data_dir: str | os.PathLike) -> dict:
    """``SPEECHCOMMANDS`` arguments for ``data_dir``.

    Accepts torchaudio's layout (``<root>/SpeechCommands/speech_commands_v0.02/<word>/*.wav``, pass
    ``<root>``) or the extracted archive itself (``<data_dir>/<word>/*.wav`` with ``validation_list.txt``).
    """
    data_dir = Path(data_dir)
    nested = data_dir / "SpeechCommands" / "speech_commands_v0.02"
    if nested.is_dir():
        return dict(root=str(data_dir))
    if (data_dir / "validation_list.txt").is_file():
        return dict(root=str(data_dir.parent), url=data_dir.name, folder_in_archive="")
    raise FileNotFoundError(
        f"no Speech Commands v2 under {data_dir}: expected {nested} (torchaudio's layout) or the extracted "
        f"archive with validation_list.txt, testing_list.txt and one folder per word"
    )


try:
    from torchaudio.datasets import SPEECHCOMMANDS as _SPEECHCOMMANDS
except ImportError:  # pragma: no cover - torchaudio is a dependency
    _SPEECHCOMMANDS = object  # type: ignore[assignment,misc]


class SoundfileSpeechCommands(_SPEECHCOMMANDS):
    """torchaudio's ``SPEECHCOMMANDS`` with the official split lists, reading audio through ``soundfile``.

    Args:
        data_dir: see :func:`_torchaudio_layout` (nothing is downloaded).
        subset: ``"training"``, ``"validation"``, ``"testing"`` or None (everything).
        sample_rate: rate the waveforms are returned at.
    """

    def __init__(self, data_dir: str | os.PathLike, subset: str | None = None, sample_rate: int = 16000) -> None:
        layout = _torchaudio_layout(data_dir)
        try:
            super().__init__(download=False, subset=subset, **layout)
        except FileNotFoundError as e:  # a list file of the official split
            raise FileNotFoundError(f"{e.filename} is missing; the official splits need validation_list.txt "
                                    "and testing_list.txt") from e
        self.sample_rate = sample_rate
        self.data_path = Path(self._path)

    def load(self, n: int) -> Tensor:
        """Waveform ``(T,)`` of clip ``n`` (raises :class:`AudioError` for an unusable file)."""
        relpath = self.get_metadata(n)[0]
        return load_audio(os.path.join(self._archive, relpath), self.sample_rate)

    def __getitem__(self, n: int) -> tuple[Tensor, int, str, str, int]:
        """torchaudio's tuple ``(waveform (1, T), sample_rate, label, speaker_id, utterance_number)``."""
        _, _, label, speaker, utterance = self.get_metadata(n)
        return self.load(n).unsqueeze(0), self.sample_rate, label, speaker, utterance


class SpeechCommandsKeywords(_SkipsBadAudio):
    """One split of Speech Commands v2 as ``(waveform, label, length)`` for the 12- or 35-class task.

    Args:
        data_dir: data set root (see :class:`SoundfileSpeechCommands`).
        split: ``"train"``, ``"val"`` or ``"test"`` (official lists).
        num_classes: 12 (10 keywords, unknown, silence) or 35 (every word).
        sample_rate: output rate in Hz.
        clip_seconds: pad / crop every clip to this length; None keeps natural lengths (padded per batch,
            with the valid length passed to the model).
        silence_percentage, unknown_percentage: 12-class only: silence clips and unknown-word clips, each
            as a percentage of the keyword clips (TensorFlow's defaults: 10 and 10).
        noise_prob: training only: probability of mixing in a background-noise segment.
        noise_volume: training: the largest background gain (uniform in ``[0, noise_volume]``); silence
            clips are background noise at such a gain in every split.
        time_shift_ms: training only: random shift of up to this many milliseconds.
        split_seed: seed of the unknown subset and of the fixed evaluation noise.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        split: str = "train",
        num_classes: int = 12,
        sample_rate: int = 16000,
        clip_seconds: float | None = 1.0,
        silence_percentage: float = 10.0,
        unknown_percentage: float = 10.0,
        noise_prob: float = 0.8,
        noise_volume: float = 0.1,
        time_shift_ms: float = 100.0,
        split_seed: int = 0,
    ) -> None:
        if split not in _SUBSETS:
            raise ValueError(f"split={split!r}; expected one of {sorted(_SUBSETS)}")
        self.classes = class_names(num_classes)
        self.split, self.training = split, split == "train"
        self.sample_rate, self.split_seed = sample_rate, split_seed
        self.num_samples = int(round(clip_seconds * sample_rate)) if clip_seconds else None
        self.noise_prob, self.noise_volume = noise_prob, noise_volume
        self.max_shift = int(time_shift_ms * sample_rate / 1000) if self.training else 0
        self.source = SoundfileSpeechCommands(data_dir, _SUBSETS[split], sample_rate)
        index = {name: i for i, name in enumerate(self.classes)}
        words = [os.path.basename(os.path.dirname(p)) for p in self.source._walker]
        if num_classes == 35:
            unknown_words = sorted({w for w in words if w not in index})
            if unknown_words:
                raise ValueError(f"words outside the 35-class vocabulary under {data_dir}: {unknown_words[:5]}")
            self.items = [(n, index[w]) for n, w in enumerate(words)]
        else:
            known = [(n, index[w]) for n, w in enumerate(words) if w in KEYWORDS]
            others = [n for n, w in enumerate(words) if w not in KEYWORDS]
            rng = np.random.default_rng([split_seed, list(_SUBSETS).index(split)])
            n_unknown = min(len(others), int(np.ceil(len(known) * unknown_percentage / 100)))
            picked = sorted(rng.choice(len(others), n_unknown, replace=False).tolist()) if n_unknown else []
            n_silence = int(np.ceil(len(known) * silence_percentage / 100))
            self.items = known + [(others[i], index[UNKNOWN]) for i in picked] + [(-1, index[SILENCE])] * n_silence
        if not self.items:
            raise ValueError(f"no clips in the {split} split under {data_dir}")
        self.init_skipping(len(self.items), substitute=self.training)
        self._bad_backgrounds = 0
        self.backgrounds = self._load_backgrounds()
        if any(n < 0 for n, _ in self.items) and not self.backgrounds:
            log.warning("no %s recordings found: silence clips will be digital silence", BACKGROUND_NOISE_DIR)

    def _load_backgrounds(self) -> list[Tensor]:
        folder = self.source.data_path / BACKGROUND_NOISE_DIR
        out = []
        for path in sorted(folder.glob("*.wav")) if folder.is_dir() else []:
            try:
                out.append(load_audio(path, self.sample_rate))
            except AudioError as e:
                self._bad_backgrounds += 1
                log.warning("skipping background noise %s: %s", path, e)
        return out

    @property
    def num_bad(self) -> int:
        """Unusable clips (each counted once) and background recordings skipped so far."""
        return super().num_bad + self._bad_backgrounds

    def __len__(self) -> int:
        return len(self.items)

    def describe(self, index: int) -> str:
        n = self.items[index][0]
        return f"{self.source.get_metadata(n)[0]} ({self.split})" if n >= 0 else f"silence clip {index}"

    def clip_info(self, index: int) -> dict[str, Any]:
        """``{"voice", "snr_db"}`` of clip ``index``: its speaker id (None for a silence clip); ``snr_db`` is
        None, since evaluation clips are read as recorded, with no noise mixed in at a set ratio."""
        n = self.items[index][0]
        return {"voice": self.source.get_metadata(n)[3] if n >= 0 else None, "snr_db": None}

    def _background(self, num_samples: int, generator: torch.Generator | None) -> Tensor:
        noise = self.backgrounds[int(torch.randint(len(self.backgrounds), (1,), generator=generator))]
        if len(noise) < num_samples:
            noise = noise.repeat(num_samples // len(noise) + 1)
        start = int(torch.randint(0, len(noise) - num_samples + 1, (1,), generator=generator))
        gain = float(torch.rand((), generator=generator)) * self.noise_volume
        return noise[start : start + num_samples] * gain

    def get(self, index: int) -> tuple[Tensor, int, int]:
        n, label = self.items[index]
        gen = None if self.training else _eval_generator(self.split_seed, self.split, index)
        if n < 0:  # silence: a background segment (digital silence when the data set has none)
            wave = torch.zeros(self.num_samples or self.sample_rate)
            if self.backgrounds:
                wave = self._background(len(wave), gen)
            return wave, label, len(wave)
        wave = self.source.load(n)
        if self.num_samples is not None:
            wave = fit_length(wave, self.num_samples, random_crop=self.training)
        wave = time_shift(wave, self.max_shift)
        if self.training and self.backgrounds and float(torch.rand(())) < self.noise_prob:
            wave = wave + self._background(len(wave), None)
        return wave, label, len(wave)


# -- the synthesised default ----------------------------------------------------------------------
class SynthKeywordDataset(_SkipsBadAudio):
    """One split of the espeak-ng keywords (:func:`diffzoo.data.synth.load_or_synthesize`) with noise mixed in.

    Args:
        data: the split's tensors ``{"waves", "words", "voices"}``.
        words: the vocabulary the ``words`` indices refer to.
        split: ``"train"`` draws fresh noise, gain and shift per read; ``"val"`` / ``"test"`` fix them per clip.
        num_classes: 12 (keywords, unknown, silence; unknown words subsampled to one keyword's count) or 35.
        snr_db: range of the speech-to-noise ratio in dB.
        gain_db: range of the clip gain in dB (clips are stored at half of full scale).
        silence_db: range of the level (dB of full scale, RMS) of noise-only silence clips.
        time_shift_ms: training only: random shift of up to this many milliseconds.
        seed: seed of the unknown subset and of the evaluation noise.
        voice_names: the names the ``voices`` indices refer to (the split's espeak-ng variants), for
            :meth:`clip_info`; None names a voice by its index.
    """

    def __init__(
        self,
        data: dict[str, Tensor],
        words: Sequence[str],
        split: str = "train",
        num_classes: int = 12,
        snr_db: tuple[float, float] = (0.0, 20.0),
        gain_db: tuple[float, float] = (-20.0, 0.0),
        silence_db: tuple[float, float] = (-60.0, -20.0),
        time_shift_ms: float = 100.0,
        seed: int = 0,
        sample_rate: int = 16000,
        voice_names: Sequence[str] | None = None,
    ) -> None:
        self.classes = class_names(num_classes)
        self.split, self.training, self.seed = split, split == "train", seed
        self.voice_names = list(voice_names) if voice_names is not None else None
        self.snr_db, self.gain_db, self.silence_db = snr_db, gain_db, silence_db
        self.max_shift = int(time_shift_ms * sample_rate / 1000) if self.training else 0
        self.waves = data["waves"]
        index = {name: i for i, name in enumerate(self.classes)}
        word_ids = data["words"].tolist()
        rows, labels = [], []
        if num_classes == 12:
            per_word = max((word_ids.count(words.index(k)) for k in KEYWORDS if k in words), default=0)
            others = [r for r, w in enumerate(word_ids) if w >= 0 and words[w] not in KEYWORDS]
            rng = np.random.default_rng([seed, SPLITS.index(split)])
            keep = sorted(rng.choice(len(others), min(per_word, len(others)), replace=False).tolist())
            unknown = {others[i] for i in keep}
        for r, w in enumerate(word_ids):
            if w < 0:
                label = index.get(SILENCE)
            elif num_classes == 12:
                label = index[words[w]] if words[w] in KEYWORDS else (index[UNKNOWN] if r in unknown else None)
            else:
                label = index[words[w]]
            if label is not None:
                rows.append(r)
                labels.append(label)
        self.rows, self.labels = rows, labels
        self.voices = data["voices"][rows]
        self.init_skipping(len(rows), substitute=self.training)
        self._rendered: dict[int, tuple[Tensor, float | None]] = {}  # evaluation splits: clips rendered so far

    def __len__(self) -> int:
        return len(self.rows)

    def describe(self, index: int) -> str:
        return f"synthesised clip {self.rows[index]} ({self.split})"

    def _render(self, index: int) -> tuple[Tensor, float | None]:
        """Clip ``index`` with its noise mixed in, and the speech-to-noise ratio it was mixed at (None for a
        silence clip, which is noise only). Evaluation splits draw from a generator seeded by the clip, so
        a clip renders the same every time: they render each clip once and keep it (every validation pass
        reads the same clips)."""
        if self.training:
            return self._draw(index, None)
        if index not in self._rendered:
            self._rendered[index] = self._draw(index, _eval_generator(self.seed, self.split, index))
        wave, snr = self._rendered[index]
        return wave.clone(), snr  # a caller may change its copy in place

    def _draw(self, index: int, gen: torch.Generator | None) -> tuple[Tensor, float | None]:
        """One rendering of clip ``index``: noise, gain, shift and SNR drawn from ``gen`` (None: torch's global
        generator, the training split's fresh draw on every read)."""
        wave = self.waves[self.rows[index]].float() / 32767.0

        def uniform(lo_hi: tuple[float, float]) -> float:
            return lo_hi[0] + (lo_hi[1] - lo_hi[0]) * float(torch.rand((), generator=gen))

        noise = colored_noise(len(wave), beta=2.0 * float(torch.rand((), generator=gen)), generator=gen)
        if self.classes[self.labels[index]] == SILENCE:
            return noise * 10 ** (uniform(self.silence_db) / 20), None
        wave = time_shift(wave * 10 ** (uniform(self.gain_db) / 20), self.max_shift)
        snr = uniform(self.snr_db)
        return mix_noise(wave, noise, snr), snr

    def get(self, index: int) -> tuple[Tensor, int, int]:
        wave, _ = self._render(index)
        return wave, self.labels[index], len(wave)

    def clip_info(self, index: int) -> dict[str, Any]:
        """``{"voice", "snr_db"}`` of clip ``index``: the espeak-ng voice that spoke it (None for silence) and
        the speech-to-noise ratio in dB its noise was mixed at (None for silence, which is noise only).

        The ratio is the one :meth:`get` uses: the split's fixed value, or the value drawn for this clip from
        ``snr_db`` by its seeded generator (the clip is rendered again to read it). A training split draws
        afresh on every read, so it has no ratio per clip and raises ``ValueError``.
        """
        if self.training:
            raise ValueError("a training split draws its noise afresh on every read: no fixed SNR per clip")
        v = int(self.voices[index])
        voice = None if v < 0 else (self.voice_names[v] if self.voice_names is not None else str(v))
        if self.classes[self.labels[index]] == SILENCE:
            snr = None
        elif self.snr_db[0] == self.snr_db[1]:
            snr = float(self.snr_db[0])
        else:
            snr = self._render(index)[1]
        return {"voice": voice, "snr_db": snr}


# -- DataModules -----------------------------------------------------------------------------------
class _AudioDataModule(pl.LightningDataModule):
    """Loaders shared by the speech DataModules: seeded epoch order, padded batches with lengths."""

    sample_rate = 16000
    train_set: Dataset | None = None
    val_set: Dataset | None = None
    test_set: Dataset | None = None

    @property
    def num_bad(self) -> int:
        """Unusable audio files skipped so far in this process."""
        return sum(getattr(ds, "num_bad", 0) for ds in (self.train_set, self.val_set, self.test_set) if ds is not None)

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        hp = self.hparams
        return (DataLoader if train else EvalDataLoader)(
            dataset, batch_size=hp.batch_size, sampler=epoch_sampler(dataset, hp.seed, shuffle=train),
            num_workers=hp.num_workers, drop_last=train, collate_fn=collate_audio,
            persistent_workers=train and hp.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return check_train_loader(self._loader(self.train_set, True), f"the training split ({len(self.train_set)} clips)")

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, False)

    predict_dataloader = test_dataloader  # the test clips, classified one by one


class SynthKeywordsDataModule(_AudioDataModule):
    """The embedded default: Speech Commands words spoken by espeak-ng, voice-disjoint splits, noise mixed in.

    The clips are synthesised on first use (about 30 s on one core) and cached in ``cache_dir``.

    Args:
        num_classes: 12 (10 keywords, unknown, silence) or 35 (every word).
        clips_per_word: clips of each word in train / val / test.
        silence_clips: noise-only clips in train / val / test (12-class silence).
        snr_db, gain_db, silence_db, time_shift_ms: noise and level ranges (see :class:`SynthKeywordDataset`).
        batch_size, num_workers: DataLoader settings.
        seed: seed of the training order.
        split_seed: seed of the voice split, of every clip's synthesis and of the evaluation noise (keep
            it fixed across runs being compared).
        cache_dir: where the synthesised clips are cached.
        snr_fixed_db: mix the noise of every clip, in every split, at exactly this speech-to-noise ratio
            instead of one drawn from ``snr_db`` (None): the noise level as one knob.
    """

    data_name = "synthesised keyword clips (voices unseen in training)"

    def __init__(
        self,
        num_classes: int = 12,
        clips_per_word: tuple[int, int, int] = (120, 30, 30),
        silence_clips: tuple[int, int, int] = (120, 30, 30),
        snr_db: tuple[float, float] = (0.0, 20.0),
        gain_db: tuple[float, float] = (-20.0, 0.0),
        silence_db: tuple[float, float] = (-60.0, -20.0),
        time_shift_ms: float = 100.0,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        split_seed: int = 0,
        cache_dir: str = "data/cache/speech_synth",
        snr_fixed_db: float | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.classes = class_names(num_classes)
        self.num_classes = num_classes
        self.config = SynthConfig(
            clips_per_word=tuple(clips_per_word), silence_clips=tuple(silence_clips), split_seed=split_seed,
        )
        self.voices: dict[str, list[str]] = {}

    def prepare_data(self) -> None:
        load_or_synthesize(self.config, self.hparams.cache_dir)  # once, on one process

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        data = load_or_synthesize(self.config, hp.cache_dir)
        self.voices = data["voices"]
        common = dict(
            words=self.config.words, num_classes=hp.num_classes, gain_db=tuple(hp.gain_db),
            snr_db=tuple(hp.snr_db) if hp.snr_fixed_db is None else (float(hp.snr_fixed_db),) * 2,
            silence_db=tuple(hp.silence_db), time_shift_ms=hp.time_shift_ms, seed=hp.split_seed,
        )
        self.train_set, self.val_set, self.test_set = (
            SynthKeywordDataset(data[split], split=split, voice_names=self.voices[split], **common) for split in SPLITS
        )


class SpeechCommandsDataModule(_AudioDataModule):
    """Google Speech Commands v2 with the official validation / test lists (nothing is downloaded).

    Args:
        data_dir: ``<root>`` of torchaudio's layout or the extracted ``speech_commands_v0.02`` folder.
        num_classes: 12 or 35.
        clip_seconds: pad / crop to this length (None: natural lengths, masked in the model).
        silence_percentage, unknown_percentage, noise_prob, noise_volume, time_shift_ms: see
            :class:`SpeechCommandsKeywords`.
        batch_size, num_workers: DataLoader settings.
        seed: seed of the training order.
        split_seed: seed of the unknown subsets and the evaluation silence.
    """

    data_name = "Speech Commands clips"

    def __init__(
        self,
        data_dir: str,
        num_classes: int = 12,
        clip_seconds: float | None = 1.0,
        silence_percentage: float = 10.0,
        unknown_percentage: float = 10.0,
        noise_prob: float = 0.8,
        noise_volume: float = 0.1,
        time_shift_ms: float = 100.0,
        batch_size: int = 128,
        num_workers: int = 4,
        seed: int = 0,
        split_seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        _torchaudio_layout(data_dir)  # fail now for a wrong path
        self.classes = class_names(num_classes)
        self.num_classes = num_classes

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        common = dict(
            num_classes=hp.num_classes, sample_rate=self.sample_rate, clip_seconds=hp.clip_seconds,
            silence_percentage=hp.silence_percentage, unknown_percentage=hp.unknown_percentage,
            noise_prob=hp.noise_prob, noise_volume=hp.noise_volume, time_shift_ms=hp.time_shift_ms,
            split_seed=hp.split_seed,
        )
        if self.train_set is None and stage in (None, "fit"):
            self.train_set = SpeechCommandsKeywords(hp.data_dir, "train", **common)
        if self.val_set is None and stage in (None, "fit", "validate"):
            self.val_set = SpeechCommandsKeywords(hp.data_dir, "val", **common)
        if self.test_set is None and stage in (None, "test"):
            self.test_set = SpeechCommandsKeywords(hp.data_dir, "test", **common)
