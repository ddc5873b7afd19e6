"""The embedded speech default: spoken command words synthesised with espeak-ng, cached to disk once.

No speech corpus ships inside a PyPI package, but the ``espeakng-loader`` wheel carries the espeak-ng
engine (``libespeak-ng.so``) and its voice data. This module drives that library through ``ctypes``
(``espeak_Initialize`` in synchronous mode, a synthesis callback collecting 16-bit samples at
22,050 Hz) to speak the 35 words of Google Speech Commands v2 (Warden, arXiv 1804.03209) with many
voices, rates and pitches.

A *voice* is an espeak-ng variant (``voices/!v/<name>``: ``f1``, ``m3``, ``klatt2``, ``whisper``, ...);
each clip is spoken by one variant on top of one English accent. Train, validation and test splits use
disjoint sets of variants, so a model is scored on voices it never heard. Clean clips (1 s at
16 kHz, the word at a random position) are synthesised once and cached under ``data/cache/``;
noise is mixed in when a clip is read (:func:`mix_noise`), freshly drawn in training and fixed per
clip for evaluation.

espeak-ng has two sources of variation between syntheses of the same text. Its noise generator
(breathy and whispered voices, aspiration) is seeded from the clock unless told otherwise, and its
waveform generator keeps state (such as the glottal phase) from one utterance to the next, in globals
of the library that no API call resets. So a set is synthesised in a process of its own, from a freshly
loaded library, with the noise generator seeded for every clip: the same :class:`SynthConfig` and the
same espeak-ng build give the same samples in any process, and the cache only saves the time of making
them again. (The resampling to 16 kHz is float arithmetic: a CPU that rounds differently may move a
sample by one step.)
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import math
import os
import sys
import threading
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger("diffzoo.data")

# Google Speech Commands v2 vocabulary: the 10 keywords of the 12-class task, then the 25 other words.
KEYWORDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
OTHER_WORDS = (
    "backward", "bed", "bird", "cat", "dog", "eight", "five", "follow", "forward", "four", "happy", "house",
    "learn", "marvin", "nine", "one", "seven", "sheila", "six", "three", "tree", "two", "visual", "wow", "zero",
)
SILENCE, UNKNOWN = "_silence_", "_unknown_"
# English accents of espeak-ng; a clip's accent is drawn from all of them in every split.
ACCENTS = ("en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc", "en-gb-x-gbclan", "en-gb-x-gbcwmd")
ESPEAK_RATE = 22050
SAMPLE_RATE = 16000

# espeak-ng C API constants (speak_lib.h)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAM_RATE, _PARAM_PITCH, _PARAM_RANGE = 1, 3, 4


def class_names(num_classes: int) -> list[str]:
    """Label names of the 12-class (10 keywords, unknown, silence) or 35-class (all words) task."""
    if num_classes == 12:
        return [*KEYWORDS, UNKNOWN, SILENCE]
    if num_classes == 35:
        return sorted((*KEYWORDS, *OTHER_WORDS))
    raise ValueError(f"num_classes={num_classes}; Speech Commands tasks have 12 or 35 classes")


def _espeak_paths() -> tuple[str, str]:
    try:
        import espeakng_loader
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "the synthesised keywords need the espeak-ng engine from the espeakng-loader wheel: "
            "pip install espeakng-loader"
        ) from e
    return espeakng_loader.get_library_path(), espeakng_loader.get_data_path()


def espeak_variants() -> list[str]:
    """Sorted names of the voice variants shipped with the wheel (``espeak-ng-data/voices/!v``)."""
    folder = Path(_espeak_paths()[1]) / "voices" / "!v"
    return sorted(p.name for p in folder.iterdir() if p.is_file() and " " not in p.name)


class Espeak:
    """The espeak-ng engine of the ``espeakng-loader`` wheel, driven through ``ctypes``.

    The C library keeps global state, so there is one engine per process (:meth:`get`) and calls are
    serialised by a lock. :meth:`speak` returns int16 samples at :attr:`sample_rate` (22,050 Hz).
    """

    _instance: Espeak | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        lib_path, data_path = _espeak_paths()
        lib = ctypes.CDLL(lib_path)
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_void_p, ctypes.c_void_p,
        ]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path.encode(), _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed (returned {rate}) with voice data at {data_path}")
        self.sample_rate = int(rate)
        self._chunks: list[np.ndarray] = []
        callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
        self._callback = callback_type(self._collect)  # keep a reference: the library holds the pointer
        lib.espeak_SetSynthCallback(self._callback)
        # espeak-ng seeds its noise generator from the clock; speak(seed=...) sets it (espeak-ng >= 1.51)
        self._set_seed = getattr(lib, "espeak_ng_SetRandSeed", None)
        if self._set_seed is not None:
            self._set_seed.argtypes = [ctypes.c_long]
        self._lib = lib
        self.variants = set(espeak_variants())

    @classmethod
    def get(cls) -> Espeak:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _collect(self, wav, num_samples: int, events) -> int:
        if num_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        return 0  # 0: continue synthesis

    def speak(self, text: str, accent: str = "en", variant: str | None = None, rate: int = 175,
              pitch: int = 50, pitch_range: int = 50, seed: int | None = None) -> np.ndarray:
        """Synthesise ``text``; returns int16 samples ``(T,)`` at :attr:`sample_rate`.

        Args:
            accent: espeak-ng language voice (``"en-us"``, ``"en-gb-scotland"``, ...).
            variant: voice variant from :func:`espeak_variants` (None: the accent's default voice).
            rate: speed in words per minute (80-450).
            pitch, pitch_range: base pitch and its range, 0-100.
            seed: seed of espeak-ng's noise generator for this utterance (None: left as it is, which at
                start-up is the clock). Same seed, same text and settings, and the same utterances before
                it in this process give the same samples.
        """
        if variant is not None and variant not in self.variants:
            # espeak-ng silently ignores an unknown variant; refuse it instead
            raise ValueError(f"unknown espeak-ng voice variant {variant!r}; see espeak_variants()")
        name = accent if variant is None else f"{accent}+{variant}"
        data = text.encode("utf-8")
        with self._lock:
            if self._lib.espeak_SetVoiceByName(name.encode()) != 0:
                raise ValueError(f"espeak-ng has no voice {name!r}")
            for param, value in ((_PARAM_RATE, rate), (_PARAM_PITCH, pitch), (_PARAM_RANGE, pitch_range)):
                self._lib.espeak_SetParameter(param, int(value), 0)
            if seed is not None:
                if self._set_seed is None:
                    raise RuntimeError("this espeak-ng build has no espeak_ng_SetRandSeed (espeak-ng < 1.51): "
                                       "its noise cannot be seeded; upgrade espeakng-loader")
                self._set_seed(int(seed))
            self._chunks = []
            err = self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            self._lib.espeak_Synchronize()
            chunks, self._chunks = self._chunks, []
        if err != 0:
            raise RuntimeError(f"espeak_Synth failed with error {err} for {text!r} ({name})")
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)


def trim_silence(wave: Tensor, threshold: float = 0.02) -> Tensor:
    """Drop leading and trailing samples quieter than ``threshold`` times the peak; ``(T,)`` -> ``(T',)``."""
    loud = (wave.abs() > threshold * wave.abs().max().clamp_min(1e-8)).nonzero()
    if len(loud) == 0:
        return wave[:0]
    return wave[int(loud[0]) : int(loud[-1]) + 1]


def colored_noise(num_samples: int, beta: float, generator: torch.Generator | None = None) -> Tensor:
    """Unit-RMS noise with power spectrum ``1 / f**beta`` (0 white, 1 pink, 2 brown); ``(num_samples,)``.

    White Gaussian noise has a spectrum of independent Gaussian bins (real and imaginary parts of equal
    variance; the DC bin, and for an even length the Nyquist bin, real with twice that variance). That
    spectrum is drawn directly and shaped, so one inverse FFT makes the clip: the distribution of filtering
    white noise, at half the FFT work (the training set draws a clip's noise on every read).
    """
    bins = num_samples // 2 + 1
    parts = torch.randn(2, bins, generator=generator)
    parts[1, 0] = 0.0
    parts[0, 0] *= math.sqrt(2.0)
    if num_samples % 2 == 0:
        parts[1, -1] = 0.0
        parts[0, -1] *= math.sqrt(2.0)
    freqs = torch.arange(bins, dtype=torch.float32).clamp_min(1.0)
    noise = torch.fft.irfft(torch.complex(parts[0], parts[1]) / freqs ** (beta / 2), n=num_samples)
    return noise / noise.pow(2).mean().sqrt().clamp_min(1e-8)


def mix_noise(wave: Tensor, noise: Tensor, snr_db: float) -> Tensor:
    """``wave + noise`` with the noise scaled to ``snr_db`` below the signal's power (same shapes), by
    :func:`torchaudio.functional.add_noise`; a silent noise segment (which that function would scale by
    infinity) leaves ``wave`` unchanged."""
    from torchaudio.functional import add_noise

    if not bool(noise.any()):
        return wave.clone()
    return add_noise(wave, noise, torch.tensor(float(snr_db), dtype=wave.dtype))


@dataclass
class SynthConfig:
    """What the synthesised keyword set holds; every field enters the cache key.

    Attributes:
        words: the vocabulary (default: the 35 Speech Commands v2 words).
        clips_per_word: clips of each word per split, ``(train, val, test)``.
        silence_clips: noise-only clips per split (the 12-class task's silence), ``(train, val, test)``.
        split_fractions: share of the voice variants in train / val / test (voice-disjoint splits).
        split_seed: seed of the variant split and of every clip's voice, rate, pitch and position.
        rate_range: speaking rate in words per minute.
        pitch_range: base pitch (espeak-ng's 0-100 scale).
        sample_rate: output rate in Hz (resampled from espeak-ng's 22,050 Hz).
        clip_seconds: clip length; the word is placed at a random offset and zero-padded.
    """

    words: tuple[str, ...] = (*KEYWORDS, *OTHER_WORDS)
    clips_per_word: tuple[int, int, int] = (40, 8, 8)
    silence_clips: tuple[int, int, int] = (120, 24, 24)
    split_fractions: tuple[float, float, float] = (0.7, 0.15, 0.15)
    split_seed: int = 0
    rate_range: tuple[int, int] = (110, 240)
    pitch_range: tuple[int, int] = (20, 80)
    sample_rate: int = SAMPLE_RATE
    clip_seconds: float = 1.0
    # bump when the synthesis itself changes. 2: espeak-ng's noise seeded per clip, each set made in a fresh
    # process (version 1 left the noise to the clock, so its clips differed from one synthesis to the next)
    version: int = 2
    accents: tuple[str, ...] = field(default=ACCENTS)

    def key(self) -> str:
        """Short hash naming the cache file."""
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


SPLITS = ("train", "val", "test")


def voice_split(variants: Sequence[str], fractions: Sequence[float], seed: int) -> dict[str, list[str]]:
    """Disjoint train / val / test sets of voice variants, a seeded shuffle cut by ``fractions``."""
    if len(fractions) != 3 or min(fractions) <= 0:
        raise ValueError(f"split_fractions={tuple(fractions)} needs three positive shares")
    order = [variants[i] for i in torch.randperm(len(variants), generator=torch.Generator().manual_seed(seed))]
    total = sum(fractions)
    n_val = max(1, round(len(order) * fractions[1] / total))
    n_test = max(1, round(len(order) * fractions[2] / total))
    if len(order) - n_val - n_test < 1:
        raise ValueError(f"{len(order)} voice variants are too few for three disjoint splits")
    return {
        "train": sorted(order[n_val + n_test :]),
        "val": sorted(order[:n_val]),
        "test": sorted(order[n_val : n_val + n_test]),
    }


def synthesize_split(config: SynthConfig, split: str, voices: Sequence[str], progress=None) -> dict[str, Tensor]:
    """Synthesise one split: int16 ``waves (N, T)``, ``words (N,)`` (index into ``config.words``, -1 for
    silence) and ``voices (N,)`` (index into ``voices``, -1 for silence)."""
    import torchaudio

    engine = Espeak.get()
    resample = torchaudio.transforms.Resample(engine.sample_rate, config.sample_rate)
    n_samples = int(round(config.clip_seconds * config.sample_rate))
    s = SPLITS.index(split)
    # one seeded stream per split, so a split does not change when another split's size does
    rng = np.random.default_rng([config.split_seed, s])
    jobs = [w for w in range(len(config.words)) for _ in range(config.clips_per_word[s])]
    jobs += [-1] * config.silence_clips[s]
    waves = torch.zeros(len(jobs), n_samples, dtype=torch.int16)
    voice_ids = torch.full((len(jobs),), -1, dtype=torch.long)
    failed = 0
    for i, word in enumerate(jobs):
        if progress is not None:
            progress.update(1)
        if word < 0:
            continue  # silence: noise is mixed in when the clip is read
        for tries in range(8):  # a voice that says nothing is retried with another
            v = int(rng.integers(len(voices)))
            raw = engine.speak(
                config.words[word], accent=config.accents[int(rng.integers(len(config.accents)))], variant=voices[v],
                rate=int(rng.integers(config.rate_range[0], config.rate_range[1] + 1)),
                pitch=int(rng.integers(config.pitch_range[0], config.pitch_range[1] + 1)),
                pitch_range=int(rng.integers(20, 91)),
                seed=clip_seed(config.split_seed, split, i, tries),
            )
            speech = trim_silence(resample(torch.from_numpy(raw.astype(np.float32) / 32768.0)))
            if len(speech) >= config.sample_rate // 20:  # at least 50 ms of sound
                break
            failed += 1
        else:
            raise RuntimeError(f"espeak-ng produced no audio for {config.words[word]!r} in 8 tries")
        speech = speech[:n_samples]
        peak = speech.abs().max().clamp_min(1e-8)
        offset = int(rng.integers(0, n_samples - len(speech) + 1))
        waves[i, offset : offset + len(speech)] = (speech / peak * 0.5 * 32767).round().to(torch.int16)
        voice_ids[i] = v
    if failed:
        log.info("%d synthesis attempts gave no audio and were redrawn", failed)
    return {"waves": waves, "words": torch.tensor(jobs, dtype=torch.long), "voices": voice_ids}


def clip_seed(split_seed: int, split: str, index: int, tries: int) -> int:
    """Seed of espeak-ng's noise generator for one synthesis attempt of one clip (a 31-bit hash)."""
    return zlib.crc32(f"{split_seed}/{split}/{index}/{tries}".encode()) & 0x7FFFFFFF


def load_or_synthesize(config: SynthConfig, cache_dir: os.PathLike = "data/cache/speech_synth",
                       show_progress: bool = True) -> dict:
    """The synthesised set for ``config``: read from ``cache_dir/<key>.pt``, or made once and written there.

    The set is made in a process of its own with a freshly loaded espeak-ng (see the module's notes), so it
    does not depend on what this process spoke before.

    Returns a dict with ``config`` (as a dict), ``voices`` (split -> variant names) and, per split,
    ``{"waves", "words", "voices"}`` tensors.
    """
    path = Path(cache_dir) / f"synth_keywords_{config.key()}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception as e:  # a truncated file from a killed run: make it again
            log.warning("cache %s is unreadable (%s); synthesising again", path, e)
    _synthesize_in_child(config, path, show_progress)
    return torch.load(path, weights_only=True)


_CHILD = "import sys; from diffzoo.data.synth import _child_main; _child_main(sys.argv[1:])"


def _synthesize_in_child(config: SynthConfig, path: Path, show_progress: bool) -> None:
    """:func:`synthesize_to` in a new interpreter (a fresh espeak-ng). A plain subprocess, not multiprocessing,
    whose spawn would import the caller's ``__main__`` again and whose fork would inherit the engine's state."""
    import subprocess

    package_root = str(Path(__file__).resolve().parents[2])  # the diffzoo this process imported, first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    args = [json.dumps(asdict(config)), str(path), "1" if show_progress else "0"]
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], env=env)
    if done.returncode != 0:
        raise RuntimeError(f"synthesising {path} failed in its own process (exit status {done.returncode}; "
                           "its error is printed above)")


def _child_main(argv: Sequence[str]) -> None:
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(argv[0]).items()}
    synthesize_to(SynthConfig(**fields), argv[1], argv[2] == "1")


def synthesize_to(config: SynthConfig, path: str, show_progress: bool = True) -> None:
    """Synthesise the set for ``config`` with this process's engine and write it to ``path`` (atomically).
    :func:`load_or_synthesize` runs it in a fresh process; called directly, the samples depend on what the
    engine spoke before in this process."""
    target = Path(path)
    voices = voice_split(espeak_variants(), config.split_fractions, config.split_seed)
    total = sum(len(config.words) * config.clips_per_word[s] + config.silence_clips[s] for s in range(3))
    from tqdm.auto import tqdm

    out: dict = {"config": json.loads(json.dumps(asdict(config))), "voices": voices}
    if show_progress:
        print(f"synthesising {total} keyword clips with espeak-ng (once) -> {target}", file=sys.stderr, flush=True)
    # disable=None: a live bar on a terminal, no carriage-return spam in log files
    with tqdm(total=total, unit="clip", disable=None if show_progress else True, mininterval=1.0) as bar:
        for split in SPLITS:
            out[split] = synthesize_split(config, split, voices[split], progress=bar)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    torch.save(out, tmp)
    os.replace(tmp, target)  # atomic: parallel runs never read a half-written cache
