"""diffzoo.data: data sets and Lightning DataModules.

Images (embedded digits, folders, webdataset shards), image-text pairs (embedded coloured digits with
captions, ``{jpg,txt}`` webdataset shards), speech (synthesised keywords, Speech Commands v2)
and text (memory-mapped token files, needle-retrieval contexts).

Names load from their modules on first use: the DataModules import Lightning, the data sets,
tokenizers and needle contexts do not; :mod:`diffzoo` itself does not.
"""

import importlib

# Each name is imported from its module on first use, so that the Lightning-free modules (needles,
# tokenizers, embedded data, audio reading) load without Lightning; the DataModules import it.
_WHERE = {
    "AudioError": "speech",
    "ByteTokenizer": "text",
    "ColoredDigits": "image_text",
    "ColoredDigitsDataModule": "image_text",
    "DigitsDataModule": "modules",
    "Espeak": "synth",
    "EvalDataLoader": "skipping",
    "ImageFolderDataModule": "modules",
    "ImageTextShardDataModule": "image_text",
    "NeedleSample": "needles",
    "RobustImageFolder": "folder",
    "ShardDataModule": "modules",
    "ShardImageDataset": "shards",
    "ShardImageTextDataset": "image_text",
    "SkipNone": "skipping",
    "SkipsBadItems": "skipping",
    "SoundfileSpeechCommands": "speech",
    "SpeechCommandsDataModule": "speech",
    "SpeechCommandsKeywords": "speech",
    "SynthConfig": "synth",
    "SynthKeywordDataset": "speech",
    "SynthKeywordsDataModule": "speech",
    "TextDataModule": "text",
    "TokenWindows": "text",
    "collate_audio": "speech",
    "colored_digit_splits": "image_text",
    "epoch_sampler": "modules",
    "expand_urls": "shards",
    "find_classes": "folder",
    "imagenet_classnames": "image_text",
    "load_audio": "speech",
    "load_mnist_5k": "embedded",
    "load_or_synthesize": "synth",
    "load_tokens": "text",
    "make_needle_sample": "needles",
    "mnist_5k_path": "embedded",
    "pydoc_topics_text": "text",
    "scan_images": "folder",
    "tokenize_corpus": "text",
    "write_image_text_shards": "image_text",
    "zeroshot_folder": "image_text",
}


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


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
