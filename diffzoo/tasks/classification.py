"""Image classification as a LightningModule: any timm model, AdamW + warmup + cosine, DeiT's regularisers.

Label smoothing and Mixup/CutMix come from timm (``timm.data.Mixup``, ``SoftTargetCrossEntropy``), the
optional weight EMA from ``timm.utils.ModelEmaV3``, top-1/top-5 from torchmetrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from ..layers.spec import get_spec
from ..weights.convert import converted_lambda_init, load_init_from
from .callbacks import GuardedTraining
from .init_from import TrainsOnlyFirst, check_train_only
from .metrics import FiniteMulticlassAccuracy
from .optim import adamw_warmup_cosine, epochs_to_steps, weight_decay_groups
from .resume import RestoresRNG


def _num_skipped(dataset: Any) -> int:
    """``num_bad`` of an evaluation data set (through ``Subset`` wrappers); 0 for one without."""
    while dataset is not None and not hasattr(dataset, "num_bad") and hasattr(dataset, "dataset"):
        dataset = dataset.dataset
    return int(getattr(dataset, "num_bad", 0) or 0)


class ImageClassificationTask(GuardedTraining, RestoresRNG, TrainsOnlyFirst, pl.LightningModule):
    """Train a timm-registered classifier (``diffvit_*``, ``softvit_*`` or any timm model).

    Args:
        model: timm model name.
        num_classes: classifier outputs (linked from the DataModule by the recipes).
        in_chans: input channels (linked from the DataModule).
        img_size: input resolution, or None for the model's default (linked from the DataModule).
        model_kwargs: extra ``timm.create_model`` arguments (``drop_path_rate``, ``global_pool``, ...).
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay; biases, norms, embeddings and 1-d parameters get none.
        betas: AdamW betas.
        warmup_epochs: linear warmup length in epochs (fractions allowed).
        min_lr_ratio: final learning rate of the cosine schedule relative to ``lr``.
        label_smoothing: label smoothing (also applied to Mixup targets).
        mixup_alpha, cutmix_alpha: Mixup / CutMix strength (0 disables; DeiT: 0.8 / 1.0).
        mixup_prob: probability of mixing a batch.
        ema_decay: weight EMA decay (e.g. 0.9998), or None for none; validated as ``val/top1_ema``.
        grad_checkpointing: recompute block activations in the backward pass.
        init_from: a folder written by ``python -m recipes.convert`` to start from (the model must have
            the converted architecture), see :func:`diffzoo.weights.load_init_from`.
        train_only: ``"attention"`` to train only the attention layers until ``unfreeze_after``.
        unfreeze_after: optimizer step from which every parameter trains (None: never, with ``train_only``).
        attn: the attention spec of a diffzoo model (``softmax``, ``softmax_wide``, ``diff``, ``diff_nonorm``,
            ``diff_const``, ``diff_v2``, ``diff_v2_matched``; :mod:`diffzoo.layers.spec`), passed to the
            model as ``attn``; None keeps the model name's own (``diffvit_*``: diff, ``softvit_*``: softmax).
    """

    def __init__(
        self,
        model: str = "diffvit_nano_patch7_28",
        num_classes: int = 10,
        in_chans: int = 3,
        img_size: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_epochs: float = 1.0,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mixup_prob: float = 1.0,
        ema_decay: float | None = None,
        grad_checkpointing: bool = False,
        init_from: str | None = None,
        train_only: str | None = None,
        unfreeze_after: int | None = None,
        attn: str | None = None,
    ) -> None:
        super().__init__()
        check_train_only(train_only)
        self.save_hyperparameters()
        import timm

        import diffzoo.models  # noqa: F401  (registers diffvit_* / softvit_* with timm)

        kwargs = dict(model_kwargs or {})
        if attn is not None:
            kwargs["attn"] = get_spec(attn).name  # one-line error for an unknown name
        if img_size is not None:
            kwargs.setdefault("img_size", img_size)
        attn = kwargs.get("attn", "diff" if model.startswith("diff") else "softmax")
        if converted_lambda_init(init_from, attn) is not None:  # built as converted (lambda_init is not a weight)
            kwargs.setdefault("lambda_init", converted_lambda_init(init_from, attn))
        self.model = timm.create_model(model, num_classes=num_classes, in_chans=in_chans, **kwargs)
        if init_from is not None:
            load_init_from(self.model, init_from)
        if grad_checkpointing:
            self.model.set_grad_checkpointing(True)
        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            from timm.data import Mixup

            self.mixup = Mixup(
                mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, prob=mixup_prob,
                label_smoothing=label_smoothing, num_classes=num_classes,
            )
        self.ema: nn.Module | None = None
        if ema_decay is not None:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.model, decay=ema_decay)
        top5 = min(5, num_classes)
        self.train_top1 = FiniteMulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_top1 = FiniteMulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_top5 = FiniteMulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.test_top1 = FiniteMulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.test_top5 = FiniteMulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.val_top1_ema = FiniteMulticlassAccuracy(num_classes, top_k=1, average="micro") if self.ema is not None else None
        self.test_top1_ema = FiniteMulticlassAccuracy(num_classes, top_k=1, average="micro") if self.ema is not None else None

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` -> ``(B, num_classes)`` logits."""
        return self.model(x)

    # -- batches -------------------------------------------------------------------------------
    #: what :meth:`on_train_epoch_end` calls the samples the data skipped
    skipped_samples = "unreadable image(s) or corrupt shard entries"

    def split_batch(self, batch: Sequence[Tensor]) -> tuple[tuple[Tensor, ...], Tensor | None]:
        """``(model inputs, labels or None)`` of a batch; image batches are ``(images, labels)``. Tasks
        whose batches carry more (e.g. valid lengths) override this one method."""
        if isinstance(batch, Tensor):  # unlabelled images (predict)
            return (batch,), None
        return (batch[0],), (batch[1] if len(batch) > 1 else None)

    # -- training ------------------------------------------------------------------------------
    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> Tensor:
        inputs, y = self.split_batch(batch)
        hard = y
        if self.mixup is not None:
            x = inputs[0]
            if len(x) % 2:  # timm's Mixup pairs samples and needs an even batch
                x, y, hard = x[:-1], y[:-1], y[:-1]
            x, y = self.mixup(x, y)  # y: (B, num_classes) soft targets
            inputs = (x, *inputs[1:])
        logits = self(*inputs)
        if y.dim() == 2:
            loss = torch.sum(-y * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
        else:
            loss = F.cross_entropy(logits.float(), y, label_smoothing=self.hparams.label_smoothing)
            self.train_top1(logits.detach(), hard)
            self.log("train/top1", self.train_top1, on_step=False, on_epoch=True)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(y), sync_dist=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)

    def on_train_epoch_start(self) -> None:
        # Shard data sets reshuffle by epoch (the DataLoader pickles them to its workers afterwards).
        loader = self.trainer.train_dataloader
        dataset = getattr(loader, "dataset", None)
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(self.current_epoch)

    def on_train_epoch_end(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        bad = int(getattr(dm, "num_bad", 0) or 0)
        self.log("data/bad_samples", float(bad), reduce_fx="sum", sync_dist=True)
        if bad:
            rank_zero_warn(f"{bad} {self.skipped_samples} were skipped so far (see the log)")

    # -- evaluation ----------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._evaluated = 0

    def on_test_epoch_start(self) -> None:
        self._evaluated = 0

    def count_evaluated(self, n: int) -> None:
        """Add ``n`` samples to the evaluated count logged as ``val/evaluated`` / ``test/evaluated``."""
        self._evaluated = getattr(self, "_evaluated", 0) + int(n)

    def on_validation_epoch_end(self) -> None:
        self.log_eval_counts("val", self.trainer.val_dataloaders)

    def on_test_epoch_end(self) -> None:
        self.log_eval_counts("test", self.trainer.test_dataloaders)

    def log_eval_counts(self, stage: str, loaders: Any) -> None:
        """Log ``<stage>/evaluated`` (samples scored) and ``<stage>/skipped`` (unusable samples left out)."""
        loaders = [] if loaders is None else loaders if isinstance(loaders, (list, tuple)) else [loaders]
        skipped = sum(_num_skipped(getattr(dl, "dataset", None)) for dl in loaders)
        evaluated = getattr(self, "_evaluated", 0)
        self.log(f"{stage}/evaluated", float(evaluated), reduce_fx="sum", sync_dist=True)
        self.log(f"{stage}/skipped", float(skipped), reduce_fx="sum", sync_dist=True)
        if skipped and not self.trainer.sanity_checking:
            rank_zero_warn(
                f"{stage}: {skipped} unusable sample(s) were left out of the {stage} metrics, which cover "
                f"{evaluated} sample(s) on this device (see the log for which)"
            )

    def _evaluate(self, batch: Sequence[Tensor], stage: str) -> Tensor:
        """Log ``<stage>/loss``, ``/top1``, ``/top5`` (and ``/top1_ema``) of one validation or test batch;
        returns the model's logits (those the metrics scored)."""
        inputs, y = self.split_batch(batch)
        self.count_evaluated(len(y))
        logits = self(*inputs)
        top1, top5 = (self.val_top1, self.val_top5) if stage == "val" else (self.test_top1, self.test_top5)
        top1(logits, y)
        top5(logits, y)
        self.log(f"{stage}/loss", F.cross_entropy(logits.float(), y), on_epoch=True, sync_dist=True, batch_size=len(y))
        self.log(f"{stage}/top1", top1, on_epoch=True, prog_bar=stage == "val")
        self.log(f"{stage}/top5", top5, on_epoch=True)
        if self.ema is not None:
            ema_top1 = self.val_top1_ema if stage == "val" else self.test_top1_ema
            ema_top1(self.ema.module(*inputs), y)
            self.log(f"{stage}/top1_ema", ema_top1, on_epoch=True)
        return logits

    def validation_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Sequence[Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Score a test batch; returns each sample's ``prediction`` (the argmax of the logits ``test/top1``
        scored) and ``label``, for callbacks that keep per-sample results
        (:class:`~diffzoo.tasks.callbacks.TestClipsCSV`)."""
        logits = self._evaluate(batch, "test")
        _, y = self.split_batch(batch)
        return {"prediction": logits.argmax(dim=-1).detach(), "label": y.detach()}

    def predict_step(self, batch: Sequence[Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Tensor]:
        """Per sample: ``prediction`` (class index), ``probability`` (its softmax probability) and, when the
        loader gives labels, ``label``; written to ``predictions.csv`` by the recipes."""
        inputs, y = self.split_batch(batch)
        probs = F.softmax(self(*inputs).float(), dim=-1)
        p, pred = probs.max(dim=-1)
        out = {"prediction": pred, "probability": p}
        if y is not None:
            out["label"] = y
        return out

    def describe_metric(self, key: str, datamodule: Any = None) -> str | None:
        """Words for a logged metric, e.g. ``"10-class validation top-1 on 1,000 MNIST digits"`` (the data
        part from ``datamodule``), or None for a metric without a description."""
        stage, _, name = key.partition("/")
        if stage not in ("val", "test") or not name.startswith("top"):
            return None
        k = name[3:].split("_")[0]
        words = f"{self.hparams.num_classes}-class {'validation' if stage == 'val' else 'test'} top-{k}"
        if name.endswith("_ema"):
            words += " of the weight EMA"
        return words + describe_split(datamodule, stage)

    # -- optimisation --------------------------------------------------------------------------
    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW groups: weight decay on matrices only (no decay on biases, norms, embeddings, lambdas)."""
        return weight_decay_groups(self.model, self.hparams.weight_decay)

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        return adamw_warmup_cosine(
            self.param_groups(), self.trainer, lr=hp.lr, betas=hp.betas,
            warmup_steps=epochs_to_steps(self.trainer, hp.warmup_epochs), min_lr_ratio=hp.min_lr_ratio,
        )


def count_of(dataset: Any, noun: str, prep: str = "on") -> str:
    """``" on 1,000 MNIST digits"`` for a sized ``dataset``; ``f" {prep} {noun}"`` without a length; ``""``
    without a dataset."""
    if dataset is None:
        return ""
    try:
        return f" {prep} {len(dataset):,} {noun}"
    except TypeError:  # a stream (shards) has no length
        return f" {prep} {noun}"


def describe_split(datamodule: Any, stage: str) -> str:
    """``" on 1,000 MNIST digits"``: the size of a DataModule's ``val``/``test``/``predict`` data and its
    ``data_name`` (empty when it has none)."""
    name = getattr(datamodule, "data_name", None)
    if not name:
        return ""
    dataset = getattr(datamodule, {"val": "val_set"}.get(stage, "test_set"), None)
    return count_of(dataset if dataset is not None else getattr(datamodule, "val_set", None), name)
