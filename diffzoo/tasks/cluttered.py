"""Image classification of a ViT built as a named attention variant, validated and tested together
(for :mod:`recipes.cluttered_digits`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch.nn.functional as F
from torch import Tensor

from ..models.variants import vit_create_args
from ..weights.export import save_safetensors
from ..weights.io import submodule_state
from .callbacks import RunSummary
from .classification import ImageClassificationTask

__all__ = ["VariantImageTask", "VariantRunSummary"]


class VariantImageTask(ImageClassificationTask):
    """:class:`ImageClassificationTask` whose ViT is the variant ``attn`` of the registered
    ``diffvit_/softvit_<size>`` models, at the data's image size with ``patch_size``.

    The first validation loader is the validation set (logged as ``val/*``), a second one the test set
    (``test/*``). Other arguments as :class:`ImageClassificationTask`.
    """

    def __init__(
        self,
        attn: str = "diff",
        size: str = "nano_patch7_28",
        patch_size: int = 8,
        num_classes: int = 10,
        in_chans: int = 1,
        img_size: int | None = 64,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_epochs: float = 1.0,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        **kwargs: Any,
    ) -> None:
        name, args = vit_create_args(attn, size, patch_size=patch_size)
        super().__init__(
            model=name, num_classes=num_classes, in_chans=in_chans, img_size=img_size, model_kwargs=args, lr=lr,
            weight_decay=weight_decay, betas=betas, warmup_epochs=warmup_epochs, min_lr_ratio=min_lr_ratio,
            label_smoothing=label_smoothing, **kwargs,
        )
        self.timm_name = name
        self.create_args = {**args, "num_classes": num_classes, "in_chans": in_chans, "img_size": img_size}

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch[0], batch[1]
        logits = self(x)
        split, metric = ("val", self.val_top1) if dataloader_idx == 0 else ("test", self.test_top1)
        if dataloader_idx == 0 or self.trainer.testing:  # val/evaluated counts the validation loader only
            self.count_evaluated(len(y))
        metric(logits, y)
        self.log(f"{split}/loss", F.cross_entropy(logits.float(), y), on_epoch=True, batch_size=len(x),
                 add_dataloader_idx=False)
        self.log(f"{split}/top1", metric, on_epoch=True, prog_bar=split == "val", add_dataloader_idx=False)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx, 1)


class VariantRunSummary(RunSummary):
    """:class:`RunSummary` for :class:`VariantImageTask`: the weights carry the timm name and the
    ``create_model`` arguments (the variant among them, as ``attn``) in their metadata, so
    :func:`diffzoo.weights.load_exported` rebuilds the model from the file alone."""

    def export_weights(
        self, pl_module: pl.LightningModule, out: Path, state_dict: dict[str, Tensor] | None = None
    ) -> dict[str, str]:
        args = pl_module.create_args
        state = submodule_state(state_dict, "model.") if state_dict is not None else pl_module.model.state_dict()
        return {"safetensors": str(save_safetensors(state, out / "model.safetensors", pl_module.timm_name, args))}

    def reload_hint(self, pl_module: pl.LightningModule, path: str) -> str:
        return f"diffzoo.weights.load_exported({path!r})"
