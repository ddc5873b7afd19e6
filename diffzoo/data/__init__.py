"""diffzoo.data: data sets and Lightning DataModules.

Images (embedded digits, folders, webdataset shards), image-text pairs (embedded coloured digits with
captions, ``{jpg,txt}`` webdataset shards), speech (synthesised keywords, Speech Commands v2)
and text (memory-mapped token files, needle-retrieval contexts).

Importing this package imports Lightning; :mod:`diffzoo` itself does not.
"""

from .embedded import load_mnist_5k, mnist_5k_path
from .folder import RobustImageFolder, find_classes, scan_images
from .image_text import (
    ColoredDigits,
    ColoredDigitsDataModule,
    ImageTextShardDataModule,
    ShardImageTextDataset,
    colored_digit_splits,
    imagenet_classnames,
    write_image_text_shards,
    zeroshot_folder,
)
from .modules import DigitsDataModule, ImageFolderDataModule, ShardDataModule, epoch_sampler
from .needles import NeedleSample, make_needle_sample
from .shards import ShardImageDataset, expand_urls
from .skipping import EvalDataLoader, SkipNone, SkipsBadItems
from .speech import (
    AudioError,
    SoundfileSpeechCommands,
    SpeechCommandsDataModule,
    SpeechCommandsKeywords,
    SynthKeywordDataset,
    SynthKeywordsDataModule,
    collate_audio,
    load_audio,
)
from .synth import Espeak, SynthConfig, load_or_synthesize
from .text import ByteTokenizer, TextDataModule, TokenWindows, load_tokens, pydoc_topics_text, tokenize_corpus

__all__ = [
    "AudioError",
    "ByteTokenizer",
    "ColoredDigits",
    "ColoredDigitsDataModule",
    "DigitsDataModule",
    "EvalDataLoader",
    "Espeak",
    "ImageFolderDataModule",
    "ImageTextShardDataModule",
    "NeedleSample",
    "RobustImageFolder",
    "ShardDataModule",
    "ShardImageDataset",
    "ShardImageTextDataset",
    "SkipNone",
    "SkipsBadItems",
    "SoundfileSpeechCommands",
    "SpeechCommandsDataModule",
    "SpeechCommandsKeywords",
    "SynthConfig",
    "SynthKeywordDataset",
    "SynthKeywordsDataModule",
    "TextDataModule",
    "TokenWindows",
    "collate_audio",
    "colored_digit_splits",
    "epoch_sampler",
    "expand_urls",
    "find_classes",
    "imagenet_classnames",
    "load_audio",
    "load_mnist_5k",
    "load_or_synthesize",
    "load_tokens",
    "make_needle_sample",
    "mnist_5k_path",
    "pydoc_topics_text",
    "scan_images",
    "tokenize_corpus",
    "write_image_text_shards",
    "zeroshot_folder",
]
