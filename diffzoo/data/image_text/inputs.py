"""What a CLIP model wants of its images (size and normalisation, read from a built open_clip model) and a
tensor transform that applies them."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # open_clip.OPENAI_DATASET_MEAN (open_clip imported lazily)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


class ToFloatTensor:
    """uint8 ``(3, H, W)`` -> normalised float ``(3, size, size)`` (bicubic resize when ``size`` differs).

    Picklable, so it works in DataLoader worker processes.
    """

    def __init__(
        self, size: int | None = None, mean: Sequence[float] = OPENAI_MEAN, std: Sequence[float] = OPENAI_STD
    ) -> None:
        self.size = size
        self.mean = torch.tensor(mean, dtype=torch.float32)[:, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[:, None, None]

    def __call__(self, image: Tensor) -> Tensor:
        x = image.float() / 255.0
        if self.size is not None and tuple(x.shape[-2:]) != (self.size, self.size):
            x = F.interpolate(x[None], size=(self.size, self.size), mode="bicubic", align_corners=False)[0].clamp(0, 1)
        return (x - self.mean) / self.std


def clip_image_settings(model: torch.nn.Module) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
    """``(image_size, mean, std)`` a built open_clip model's preprocessing asks for
    (``open_clip.get_model_preprocess_cfg``; OpenAI's mean and std where it names none). The model is
    read, not looked up by name: what a recipe hands the image-text DataModules."""
    import open_clip

    cfg = open_clip.get_model_preprocess_cfg(model)
    size = cfg.get("size", 224)
    size = int(size[0] if isinstance(size, (list, tuple)) else size)
    return size, tuple(cfg.get("mean") or OPENAI_MEAN), tuple(cfg.get("std") or OPENAI_STD)


def require_tokenizer(tokenizer: object, data: str) -> None:
    """Raise ``ValueError`` naming ``data`` when no tokenizer was given."""
    if tokenizer is None:
        raise ValueError(f"{data} needs the model's tokenizer (tokenizer=open_clip.get_tokenizer(name), or "
                         "ContrastiveTask.tokenizer); recipes.clip passes the model's")

