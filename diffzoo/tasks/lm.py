"""Causal language modelling as a LightningModule: AdamW + warmup + cosine, validation loss and perplexity, and
needle-retrieval accuracy when the data holds fixed retrieval contexts (``TextDataModule(needle_eval=N)``).

Gradient accumulation is the Trainer's (``accumulate_grad_batches``); the learning-rate schedule counts
optimizer steps. Checkpoints carry the Python/NumPy/torch RNG states, so a resumed run continues exactly.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from ..evaluation.retrieval import retrieval_hits
from ..models.lm import LM_PRESETS, CausalLM, LMConfig, preset_args
from ..weights.convert import converted_lambda_init, load_init_from
from ..weights.export import export_lm
from .callbacks import GuardedTraining, RunSummary
from .init_from import TrainsOnlyFirst, check_train_only
from .optim import adamw_warmup_cosine, weight_decay_groups
from .resume import RestoresRNG

__all__ = ["LMRunSummary", "LanguageModelTask"]


class LanguageModelTask(GuardedTraining, RestoresRNG, TrainsOnlyFirst, pl.LightningModule):
    """Train a :class:`~diffzoo.models.lm.CausalLM` on next-token prediction.

    Args:
        model: a preset name of :data:`~diffzoo.models.lm.LM_PRESETS`.
        attn: an attention spec name of :mod:`diffzoo.layers.spec` (``"diff"``, ``"diff_v2"``, ``"softmax"``,
            ``"softmax_wide"``, ``"diff_nonorm"``, ``"diff_const"``, ``"diff_v2_matched"``).
        vocab_size: tokenizer vocabulary (linked from the DataModule by the recipe).
        model_kwargs: further :class:`~diffzoo.models.lm.LMConfig` fields (``dim``, ``depth``, ...).
        lr: peak learning rate.
        weight_decay: AdamW weight decay on matrices (not on norms, lambdas, embeddings).
        betas: AdamW betas.
        warmup_steps: linear warmup in optimizer steps.
        min_lr_ratio: final learning rate of the cosine relative to ``lr``.
        init_from: a folder written by ``python -m recipes.convert`` to start from (``model``/``attn``/
            ``model_kwargs`` must give the converted architecture), see :func:`diffzoo.weights.load_init_from`.
        train_only: ``"attention"`` to train only the attention layers until ``unfreeze_after``.
        unfreeze_after: optimizer step from which every parameter trains (None: never, with ``train_only``).
    """

    def __init__(
        self,
        model: str = "lm_nano",
        attn: str = "diff",
        vocab_size: int = 256,
        model_kwargs: dict[str, Any] | None = None,
        lr: float = 3e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 50,
        min_lr_ratio: float = 0.1,
        init_from: str | None = None,
        train_only: str | None = None,
        unfreeze_after: int | None = None,
    ) -> None:
        super().__init__()
        check_train_only(train_only)
        self.save_hyperparameters()
        if model not in LM_PRESETS:
            raise ValueError(f"unknown model preset {model!r}; choose one of {sorted(LM_PRESETS)}")
        args = preset_args(model, **{"vocab_size": vocab_size, "attn": attn, **(model_kwargs or {})})
        if converted_lambda_init(init_from, args["attn"]) is not None:  # built as converted (not a weight)
            args.setdefault("lambda_init", converted_lambda_init(init_from, args["attn"]))
        self.config = LMConfig(**args)
        self.model = CausalLM(self.config)
        if init_from is not None:
            load_init_from(self.model, init_from)
        self.val_loss = MeanMetric()

    def forward(self, tokens: Tensor, **kwargs: Any) -> Tensor:
        """``(B, N)`` tokens -> ``(B, N, vocab)`` logits."""
        return self.model(tokens, **kwargs)

    def loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(batch[0]),
                 sync_dist=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.val_loss.update(self.loss(batch), weight=len(batch[0]))

    def _log_eval_loss(self, stage: str) -> None:
        loss = self.val_loss.compute()  # synchronised over ranks
        self.val_loss.reset()
        # identical on every rank already; sync_dist keeps Lightning's distributed check satisfied
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=True)
        self.log(f"{stage}/ppl", torch.exp(loss), sync_dist=True)

    def _needle_contexts(self, stage: str) -> list:
        """The data's fixed retrieval contexts of ``stage`` (none when the data has none)."""
        data = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        contexts = getattr(data, "needle_contexts", None)
        return contexts(stage) if contexts is not None else []

    def _log_needle_acc(self, stage: str) -> None:
        """``{stage}/needle_acc``: share of the data's retrieval contexts whose answer the model produces exactly
        (:func:`~diffzoo.evaluation.retrieval.retrieval_hits`); every rank scores all of them."""
        contexts = self._needle_contexts(stage)
        if not contexts or self.trainer.sanity_checking:
            return
        batch_size = getattr(getattr(self.trainer.datamodule, "hparams", None), "batch_size", 16)
        with self.trainer.precision_plugin.forward_context():  # the precision the validation loss is computed in
            hits = retrieval_hits(self.model, contexts, batch_size=batch_size)
        self.log(f"{stage}/needle_acc", hits.float().mean().to(self.device), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self._log_eval_loss("val")
        self._log_needle_acc("val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        self._log_eval_loss("test")
        self._log_needle_acc("test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Tensor]:
        """Per window: ``loss`` (mean next-token cross-entropy, nats) and ``accuracy`` (share of next tokens
        that are the model's top prediction); written to ``predictions.csv`` by the recipe."""
        x, y = batch
        logits = self.model(x).float()
        loss = F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(dim=1)
        return {"loss": loss, "accuracy": (logits.argmax(-1) == y).float().mean(dim=1)}

    def describe_metric(self, key: str, datamodule: Any = None) -> str | None:
        """Words for ``val/loss`` / ``test/loss`` / ``*/ppl`` / ``*/needle_acc`` including the data they were
        measured on."""
        stage, _, name = key.partition("/")
        if stage not in ("val", "test") or name not in ("loss", "ppl", "needle_acc"):
            return None
        if name == "needle_acc":
            contexts = getattr(datamodule, "needle_contexts", None)
            contexts = contexts(stage) if contexts is not None else []
            windows = len({id(c.tokens) for c in contexts})  # the answers of one "recall" window share its tokens
            asked = f"{len(contexts):,} answers in " if windows != len(contexts) else ""
            where = (f" on {asked}{windows:,} fixed contexts of {len(contexts[0].tokens)} tokens from held-out text"
                     if contexts else "")
            what = "answers produced" if asked else "contexts whose answer is produced"
            return f"{'validation' if stage == 'val' else 'test'} needle retrieval: share of {what} exactly{where}"
        what = "cross-entropy (nats per token)" if name == "loss" else "perplexity"
        windows = getattr(datamodule, "val_set", None)
        where = f" on {len(windows):,} held-out windows of {datamodule.hparams.seq_len} tokens" if windows else ""
        return f"{'validation' if stage == 'val' else 'test'} next-token {what}{where}"

    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW groups of :func:`~diffzoo.tasks.optim.weight_decay_groups`."""
        return weight_decay_groups(self.model, self.hparams.weight_decay)

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        return adamw_warmup_cosine(self.param_groups(), self.trainer, lr=hp.lr, betas=hp.betas,
                                   warmup_steps=hp.warmup_steps, min_lr_ratio=hp.min_lr_ratio)


class LMRunSummary(RunSummary):
    """:class:`~diffzoo.tasks.callbacks.RunSummary` for the LM: ``model.safetensors`` by
    :func:`~diffzoo.weights.export_lm`,
    the attention kind and parameter count in ``summary.json``, and loss with perplexity as the headline.

    Args:
        export: write ``model.safetensors``.
        monitor: metric reported as the headline result (a loss in nats).
    """

    def __init__(self, export: bool = True, monitor: str = "val/loss") -> None:
        super().__init__(export=export, monitor=monitor)

    def export_weights(
        self, pl_module: pl.LightningModule, out: Path, state_dict: dict[str, Tensor] | None = None
    ) -> dict[str, str]:
        return {"safetensors": str(export_lm(pl_module, out / "model.safetensors", state_dict))}

    def reload_hint(self, pl_module: pl.LightningModule, path: str) -> str:
        return f"diffzoo.weights.load_lm({path!r})"

    def extra_fields(self, pl_module: pl.LightningModule) -> dict[str, Any]:
        params = sum(p.numel() for p in pl_module.model.parameters())
        return {"attn": pl_module.hparams.get("attn"), "parameters": params}

    def headline(self, value: float | None, description: str | None) -> str:
        shown = f"{value:.4f} (perplexity {math.exp(value):.2f})" if value is not None else "not measured"
        return f"{self.monitor}: {shown}" + (f"  ({description})" if description else "")
