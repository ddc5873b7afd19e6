"""Multi-query associative recall as a LightningModule: a :class:`~diffzoo.models.lm.CausalLM` of any
named attention variant, trained on the query positions only, scored by exact value accuracy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from ..data.mqar import IGNORE
from ..models.lm import CausalLM, LMConfig
from ..weights.convert import converted_lambda_init, load_init_from
from ..weights.export import save_safetensors
from ..weights.io import submodule_state
from .callbacks import GuardedTraining, RunSummary
from .init_from import TrainsOnlyFirst, check_train_only
from .lm import LanguageModelTask
from .resume import RestoresRNG

__all__ = ["MQARRunSummary", "MQARTask", "query_accuracy"]


def query_accuracy(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """``(correct, total)`` over the labelled positions (labels ``!= -100``) of ``(B, N, V)`` logits."""
    mask = labels != IGNORE
    correct = (logits.argmax(-1) == labels) & mask
    return correct.sum(), mask.sum()


class MQARTask(GuardedTraining, RestoresRNG, TrainsOnlyFirst, pl.LightningModule):
    """Train a causal LM on MQAR (:mod:`diffzoo.data.mqar`).

    Args:
        attn: an attention spec name of :mod:`diffzoo.layers.spec` (``softmax``, ``diff``, ``diff_v2_matched`` ...).
        vocab_size: key plus value alphabet (linked from the DataModule by the recipe).
        dim, depth, num_heads: the softmax baseline's shape (variants derive theirs from it).
        intermediate_size: SwiGLU width (None: LLaMA's 8/3 ``dim``).
        lr: peak AdamW learning rate; weight_decay: on matrices only.
        warmup_steps: linear warmup in optimizer steps; min_lr_ratio: end of the cosine.
        max_seq_len: the RoPE/cache length bound of the model (>= the sequence length).
        init_from: a folder written by ``python -m recipes.convert`` to start from (``attn`` and the shape
            must give the converted architecture), see :func:`diffzoo.weights.load_init_from`.
        train_only: ``"attention"`` to train only the attention layers until ``unfreeze_after``.
        unfreeze_after: optimizer step from which every parameter trains (None: never, with ``train_only``).
    """

    def __init__(
        self,
        attn: str = "diff",
        vocab_size: int = 128,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        intermediate_size: int | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_steps: int = 50,
        min_lr_ratio: float = 0.1,
        max_seq_len: int = 2048,
        init_from: str | None = None,
        train_only: str | None = None,
        unfreeze_after: int | None = None,
    ) -> None:
        super().__init__()
        check_train_only(train_only)
        self.save_hyperparameters()
        self.config = LMConfig(vocab_size=vocab_size, dim=dim, depth=depth, num_heads=num_heads,
                               intermediate_size=intermediate_size, max_seq_len=max_seq_len, attn=attn,
                               lambda_init=converted_lambda_init(init_from, attn))  # a converted model's, if any
        self.model = CausalLM(self.config)
        if init_from is not None:
            load_init_from(self.model, init_from)
        self.val_loss = torch.nn.ModuleList([MeanMetric(), MeanMetric()])
        self._counts = torch.zeros(2, 2, dtype=torch.long)  # (val, test) x (correct, total)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.model(tokens)

    def _loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        tokens, labels = batch
        logits = self(tokens)
        loss = self._loss(logits, labels)
        correct, total = query_accuracy(logits.detach(), labels)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(tokens))
        self.log("train/acc", correct.float() / total, on_step=False, on_epoch=True, batch_size=len(tokens))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def on_validation_epoch_start(self) -> None:
        self._counts.zero_()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        tokens, labels = batch
        logits = self(tokens)
        self.val_loss[dataloader_idx].update(self._loss(logits, labels), weight=len(tokens))
        correct, total = query_accuracy(logits, labels)
        self._counts[dataloader_idx] += torch.stack([correct, total]).cpu()

    def on_validation_epoch_end(self) -> None:
        for i, split in enumerate(("val", "test")):
            if int(self._counts[i, 1]) == 0:
                continue
            self.log(f"{split}/loss", self.val_loss[i].compute(), add_dataloader_idx=False)
            self.val_loss[i].reset()
            self.log(f"{split}/acc", self._counts[i, 0].float() / self._counts[i, 1], prog_bar=split == "val",
                     add_dataloader_idx=False)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx, 1)

    def on_test_epoch_start(self) -> None:
        self._counts.zero_()

    on_test_epoch_end = on_validation_epoch_end

    # AdamW (decay on matrices only) with linear warmup and cosine, exactly as the language-model task
    param_groups = LanguageModelTask.param_groups
    configure_optimizers = LanguageModelTask.configure_optimizers


class MQARRunSummary(RunSummary):
    """:class:`RunSummary` for :class:`MQARTask`: headline ``val/acc``; the weights are exported with the
    variant and the LM shape in their metadata."""

    def __init__(self, export: bool = True, monitor: str = "val/acc") -> None:
        super().__init__(export, monitor)

    def export_weights(
        self, pl_module: pl.LightningModule, out: Path, state_dict: dict[str, Tensor] | None = None
    ) -> dict[str, str]:
        args = dataclasses.asdict(pl_module.model.config)  # LMConfig fields: diffzoo.weights.load_lm rebuilds it
        state = submodule_state(state_dict, "model.") if state_dict is not None else dict(pl_module.model.state_dict())
        state.pop("output.weight", None)  # tied to the token embedding (stored once)
        path = save_safetensors(state, out / "model.safetensors", "mqar_lm", args)
        return {"safetensors": str(path)}

    def reload_hint(self, pl_module: pl.LightningModule, path: str) -> str:
        return f"diffzoo.weights.load_lm({path!r})"
