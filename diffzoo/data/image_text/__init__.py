"""Image-text data for contrastive (CLIP) training: the embedded coloured digits and webdataset shards.

DiffCLIP (Hammoud & Ghanem, arXiv 2503.06626) trains CLIP with differential attention on CC3M / CC12M
image-text pairs. Two sources are provided here:

* **Coloured digits** (the embedded default, no download): the 5,000 real MNIST digits of
  :func:`diffzoo.data.embedded.load_mnist_5k`, drawn in a foreground colour on a background colour at
  32x32 RGB and captioned ``"a red seven on a blue background"``. Six colours give 30 ordered
  ``(fg, bg)`` pairs; six of them (:func:`heldout_pairs`) never occur in training and form the zero-shot
  test split, while their swapped pairs (``blue`` on ``red``) are trained on, so scoring the held-out
  pairs needs the caption's attributes bound to the right object, not a bag of words. Digit images are
  split first (train / val / test images are disjoint), then coloured. ``num_colors`` (3 to 6) keeps
  only the first colours and ``digits`` a subset of the digits: smaller tasks with fewer captions.
* **Image-text shards** in the CC3M / CC12M webdataset layout (``<key>.jpg`` + ``<key>.txt``, as written
  by img2dataset): brace-expanded URLs, split by node and DataLoader worker, UTF-8 captions tokenised by
  a passed tokenizer; a corrupt shard or sample is logged, counted and skipped.

Images are tensors ``(3, H, W)`` through a ``transform`` argument, so open_clip's ``preprocess`` (a PIL
transform; pass ``as_pil=True`` for the digits) or a tensor transform (:class:`ToFloatTensor`) can be used.
The DataModules take the model's tokenizer, input size and normalisation as arguments and never look a
model up by name; :func:`clip_image_settings` reads the last two from a built open_clip model.

Modules: :mod:`.colored_digits`, :mod:`.shards`, :mod:`.zeroshot_folders` (zero-shot image folders and
their class names) and :mod:`.inputs` (image settings and the tensor transform). Every name is
importable from ``diffzoo.data.image_text`` (configs name the DataModules so).
"""

from .colored_digits import (
    CAPTION_TEMPLATES,
    COLOR_NAMES,
    DIGIT_WORDS,
    PALETTE,
    ColoredDigits,
    ColoredDigitsDataModule,
    caption,
    class_name,
    color_pairs,
    colored_digit_splits,
    digit_classes,
    heldout_pairs,
    render_digits,
)
from .inputs import OPENAI_MEAN, OPENAI_STD, ToFloatTensor, clip_image_settings
from .shards import ImageTextShardDataModule, ShardImageTextDataset, write_image_text_shards
from .zeroshot_folders import imagenet_classnames, read_classnames, zeroshot_folder

__all__ = [
    "CAPTION_TEMPLATES",
    "COLOR_NAMES",
    "DIGIT_WORDS",
    "OPENAI_MEAN",
    "OPENAI_STD",
    "PALETTE",
    "ColoredDigits",
    "ColoredDigitsDataModule",
    "ImageTextShardDataModule",
    "ShardImageTextDataset",
    "ToFloatTensor",
    "caption",
    "class_name",
    "clip_image_settings",
    "color_pairs",
    "colored_digit_splits",
    "digit_classes",
    "heldout_pairs",
    "imagenet_classnames",
    "read_classnames",
    "render_digits",
    "write_image_text_shards",
    "zeroshot_folder",
]
