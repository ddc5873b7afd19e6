"""diffzoo.data: image data sets and Lightning DataModules (the embedded digits, folders, webdataset shards).

Importing this package imports Lightning; :mod:`diffzoo` itself does not.
"""

from .embedded import load_mnist_5k, mnist_5k_path
from .folder import RobustImageFolder, find_classes, scan_images
from .modules import DigitsDataModule, ImageFolderDataModule, ShardDataModule, epoch_sampler
from .shards import ShardImageDataset, expand_urls

__all__ = [
    "DigitsDataModule",
    "ImageFolderDataModule",
    "RobustImageFolder",
    "ShardDataModule",
    "ShardImageDataset",
    "epoch_sampler",
    "expand_urls",
    "find_classes",
    "load_mnist_5k",
    "mnist_5k_path",
    "scan_images",
]
