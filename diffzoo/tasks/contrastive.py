"""Contrastive image-text training (CLIP / DiffCLIP) as a LightningModule, for any open_clip model.

DiffCLIP (Hammoud & Ghanem, arXiv 2503.06626) trains CLIP with differential attention using the standard
CLIP recipe; this module is that recipe: open_clip's model by name, ``open_clip.ClipLoss`` (symmetric
InfoNCE with a learned temperature, features gathered across DDP ranks), AdamW without weight decay on
gains, biases, embeddings and the temperature, linear warm-up then cosine, and ``logit_scale`` clamped to
``ln(100)`` after each step. Validation scores zero-shot classification and image-text retrieval.

**Gradient accumulation** (``Trainer(accumulate_grad_batches=k)``) averages the losses of ``k``
micro-batches: each micro-batch's contrastive loss uses only the negatives of that micro-batch (times the
DDP world size), so accumulation saves memory but is *not* a larger contrastive batch. For the paper's
effective batch use more devices or a larger per-device batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from ..evaluation.zeroshot import pair_retrieval, topk_hits, zero_shot_classifier
from ..weights.clip import check_model_name, load_clip_weights
from ..weights.convert import load_converted
from ..weights.export import save_safetensors
from ..weights.io import submodule_state
from .callbacks import GuardedTraining, RunSummary
from .classification import count_of
from .optim import adamw_warmup_cosine, epochs_to_steps, weight_decay_groups
from .resume import RestoresRNG

MAX_LOGIT_SCALE = math.log(100.0)
# Parameter names (substrings) trained without weight decay, besides every parameter with < 2 dims.
NO_DECAY_NAMES = ("bias", "logit_scale", "logit_bias", "embedding", "norm", "ln_", "bn")
# The DataModule attributes holding what each stage's zero-shot and retrieval scores are measured on (for the
# metric descriptions); the first one a DataModule has is used.
ZEROSHOT_SETS = {"val": ("val_heldout_set", "zeroshot_set"), "test": ("test_set", "zeroshot_set")}
PAIR_SETS = {"val": ("val_set",), "test": ("test_pairs_set", "val_set")}


def split_clip_output(out: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``(image_features, text_features, logit_scale)`` from an open_clip model's ``forward`` (tuple or dict)."""
    if isinstance(out, dict):
        return out["image_features"], out["text_features"], out["logit_scale"]
    return out[0], out[1], out[2]


class ContrastiveTask(GuardedTraining, RestoresRNG, pl.LightningModule):
    """Train an open_clip-registered model (``DiffCLIP-*``, ``SoftCLIP-*`` or any open_clip config).

    Batches: ``(images, tokens)`` for training. Validation loaders may give ``(images, tokens)`` pairs
    (scored by retrieval over the whole loader, identical captions merged; also ``val/loss``) or
    ``(images, labels)`` (scored zero-shot against the DataModule's ``zeroshot_classnames`` and
    ``zeroshot_templates``; ``zeroshot_hard_negative`` adds ``val/zs_pair``). Logged: ``val/zs_top1``,
    ``val/zs_top5``, ``val/zs_pair``, ``val/i2t_r{1,5,10}``, ``val/t2i_r{1,5,10}``, ``val/mean_recall``.
    Test loaders are told apart the same way and their scores logged as ``test/*``.

    Args:
        model: open_clip model name.
        pretrained: open_clip pretrained tag or weight file to start from.
        checkpoint: weights to start from (diffzoo Lightning checkpoint, open_clip checkpoint, state
            dict or safetensors), loaded after ``pretrained``. Resuming a run uses ``--ckpt_path`` instead.
        init_from: a folder written by ``python -m recipes.convert --from open_clip:MODEL`` to start from:
            the model is rebuilt from the folder (``MODEL`` with its attention converted) and its weights
            loaded, see :func:`diffzoo.weights.load_converted`. ``model`` must name the converted source.
        model_kwargs: more ``open_clip.create_model`` arguments (``force_image_size``, ...). For a diffzoo
            config a ``vision_cfg`` or ``text_cfg`` in it changes only the entries it names, e.g.
            ``{"vision_cfg": {"width": 64}}`` narrows the image tower and keeps the rest of it.
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay on matrices (none on biases, norms, embeddings, logit_scale).
        betas, eps: AdamW betas and epsilon (CLIP: 0.9, 0.98, 1e-6).
        warmup_steps: linear warm-up in optimizer steps; None to use ``warmup_epochs``.
        warmup_epochs: warm-up length in epochs (fractions allowed) when ``warmup_steps`` is None.
        min_lr_ratio: final learning rate of the cosine relative to ``lr``.
        local_loss: under DDP, each rank scores its own queries against all gathered features
            (open_clip ``--local-loss``); the same loss as the global one, less memory.
        gather_with_grad: gather features with gradients (open_clip ``--gather-with-grad``).
        grad_checkpointing: recompute transformer blocks in the backward pass.
        zeroshot_classes_per_batch: classes encoded per text batch when building the classifier.
        retrieval_ks: recall cut-offs.
        attn: the attention spec of both towers of a diffzoo CLIP (``softmax``, ``diff``, ``diff_nonorm``, ...
            :mod:`diffzoo.layers.spec`); None keeps the config's (see :func:`diffzoo.models.clip.with_attn`).
    """

    def __init__(
        self,
        model: str = "DiffCLIP-nano",
        pretrained: str | None = None,
        checkpoint: str | None = None,
        model_kwargs: dict[str, Any] | None = None,
        lr: float = 5e-4,
        weight_decay: float = 0.2,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-6,
        warmup_steps: int | None = None,
        warmup_epochs: float = 1.0,
        min_lr_ratio: float = 0.0,
        local_loss: bool = True,
        gather_with_grad: bool = True,
        grad_checkpointing: bool = False,
        zeroshot_classes_per_batch: int = 10,
        retrieval_ks: Sequence[int] = (1, 5, 10),
        init_from: str | None = None,
        attn: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        import open_clip

        check_model_name(model)
        #: the ``open_clip.create_model`` arguments the model was built with (exported with its weights)
        self.model_kwargs = dict(model_kwargs or {})
        if init_from is not None:
            if pretrained or checkpoint or model_kwargs or attn:
                raise ValueError("--model.init_from rebuilds the converted model from its folder; leave "
                                 "--model.pretrained, --model.checkpoint, --model.model_kwargs and --model.attn unset")
            self.model = load_converted(init_from, what="--model.init_from", family="open_clip", name=model).train()
        else:
            from ..models.clip import clip_model_names, with_attn, with_towers

            if attn is not None:
                self.model_kwargs = with_attn(model, attn, self.model_kwargs)
            elif model in clip_model_names():  # a partial tower config changes only what it names
                self.model_kwargs = with_towers(model, self.model_kwargs)
            self.model = open_clip.create_model(model, pretrained=pretrained, **self.model_kwargs)
        if checkpoint:
            load_clip_weights(self.model, checkpoint)
        if grad_checkpointing:
            self.model.set_grad_checkpointing(True)
        self.loss_fn = open_clip.ClipLoss()  # replaced in setup() when training on several devices
        self._tokenizer = None
        self._classifier: Tensor | None = None
        self._reset_eval_state()

    @property
    def tokenizer(self):
        """The model's open_clip tokenizer (built on first use)."""
        if self._tokenizer is None:
            import open_clip

            self._tokenizer = open_clip.get_tokenizer(self.hparams.model)
        return self._tokenizer

    def setup(self, stage: str) -> None:
        import open_clip

        world = self.trainer.world_size
        self.loss_fn = open_clip.ClipLoss(
            local_loss=self.hparams.local_loss and world > 1, gather_with_grad=self.hparams.gather_with_grad,
            cache_labels=True, rank=self.global_rank, world_size=world,
        )

    def forward(self, images: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(B, 3, H, W)`` images and ``(B, L)`` tokens -> normalised features ``(B, E)`` x2 and ``exp(logit_scale)``."""
        return split_clip_output(self.model(images, tokens))

    # -- training ------------------------------------------------------------------------------
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, tokens = batch[0], batch[1]
        img, txt, scale = self(images, tokens)
        loss = self.loss_fn(img, txt, scale)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(images))
        self.log("train/logit_scale", scale.detach().float(), on_step=True, on_epoch=False)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # CLIP clamps the temperature after every optimizer step (idempotent on accumulation steps).
        scale = getattr(self.model, "logit_scale", None)
        if isinstance(scale, torch.Tensor):
            with torch.no_grad():
                scale.clamp_(0, MAX_LOGIT_SCALE)

    def on_train_epoch_start(self) -> None:
        dataset = getattr(self.trainer.train_dataloader, "dataset", None)
        if hasattr(dataset, "set_epoch"):  # shard data sets reshuffle by epoch
            dataset.set_epoch(self.current_epoch)

    def on_train_epoch_end(self) -> None:
        bad = int(getattr(getattr(self.trainer, "datamodule", None), "num_bad", 0) or 0)
        self.log("data/bad_samples", float(bad), reduce_fx="sum", sync_dist=True)
        if bad:
            rank_zero_warn(f"{bad} corrupt shard(s) or sample(s) were skipped so far (see the log)")

    # -- evaluation ----------------------------------------------------------------------------
    def _reset_eval_state(self) -> None:
        self._pairs: list[tuple[Tensor, Tensor, Tensor]] = []
        self._zs = torch.zeros(4, dtype=torch.long)  # top1 hits, top5 hits, pair wins, images

    def _build_classifier(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        names = getattr(dm, "zeroshot_classnames", None)
        self._classifier = None
        if names:
            self._classifier = zero_shot_classifier(
                self.model, self.tokenizer, names, dm.zeroshot_templates, device=self.device,
                classes_per_batch=self.hparams.zeroshot_classes_per_batch,
            )

    def on_validation_epoch_start(self) -> None:
        self._reset_eval_state()
        self._build_classifier()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, "val")

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        images, target = batch[0], batch[1]
        if target.dim() == 2:  # (images, tokens): retrieval pairs
            img, txt, scale = self(images, target)
            loss = self._local_loss(img, txt, scale)
            self.log(f"{stage}/loss", loss, on_epoch=True, sync_dist=True, batch_size=len(images),
                     add_dataloader_idx=False)
            self._pairs.append((img.detach().float().cpu(), txt.detach().float().cpu(), target.cpu()))
            return
        if self._classifier is None:
            raise ValueError(
                f"a {stage} loader gives (images, labels) but the DataModule has no zeroshot_classnames"
            )
        feats = self.model.encode_image(images, normalize=True).float()
        logits = feats @ self._classifier  # (B, C)
        hits = topk_hits(logits, target, (1, 5))
        self._zs[0] += hits[1]
        self._zs[1] += hits[5]
        neg = getattr(self.trainer.datamodule, "zeroshot_hard_negative", None)
        if neg is not None:
            neg = neg.to(target.device)[target]
            self._zs[2] += int((logits.gather(1, target[:, None]) > logits.gather(1, neg[:, None])).sum())
        self._zs[3] += len(target)

    def _local_loss(self, img: Tensor, txt: Tensor, scale: Tensor) -> Tensor:
        """Validation loss with this rank's batch as negatives (validation batches may differ across ranks)."""
        import open_clip

        return open_clip.ClipLoss()(img, txt, scale)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")

    def _log_eval(self, stage: str) -> None:
        metrics: dict[str, float] = {}
        zs = self.trainer.strategy.reduce(self._zs.to(self.device), reduce_op="sum") if self.trainer.world_size > 1 \
            else self._zs
        zs = zs.tolist()
        if zs[3]:
            metrics[f"{stage}/zs_top1"] = zs[0] / zs[3]
            metrics[f"{stage}/zs_top5"] = zs[1] / zs[3]
            if getattr(self.trainer.datamodule, "zeroshot_hard_negative", None) is not None:
                metrics[f"{stage}/zs_pair"] = zs[2] / zs[3]
        if self._pairs:
            img, txt, tok = (self._gather_cat(torch.cat(parts)) for parts in zip(*self._pairs))
            for k, v in pair_retrieval(img, txt, tok, ks=tuple(self.hparams.retrieval_ks)).items():
                metrics[f"{stage}/{k}"] = v
        for key, value in metrics.items():  # identical on every rank (gathered above): the sync changes nothing
            self.log(key, value, prog_bar=key in ("val/zs_top1", "val/i2t_r1"), sync_dist=True)
        self._reset_eval_state()
        self._classifier = None

    # test: the same scores on the DataModule's test loaders, logged as test/*
    on_test_epoch_start = on_validation_epoch_start

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")

    def on_predict_epoch_start(self) -> None:
        self._build_classifier()
        if self._classifier is None:
            raise ValueError("predict needs zero-shot class names: the DataModule has no zeroshot_classnames "
                             "(set --data.init_args.zeroshot_dir for shard data)")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        """Zero-shot classification per image: ``prediction`` (class index), ``class_name``, ``probability``
        (softmax over the classes at the model's temperature) and ``label`` when the loader gives one."""
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        feats = self.model.encode_image(images, normalize=True).float()
        scale = self.model.logit_scale.exp().float() if hasattr(self.model, "logit_scale") else 100.0
        p, pred = torch.softmax(scale * feats @ self._classifier, dim=-1).max(dim=-1)
        names = self.trainer.datamodule.zeroshot_classnames
        out: dict[str, Any] = {"prediction": pred, "class_name": [names[i] for i in pred.tolist()], "probability": p}
        if isinstance(batch, (tuple, list)) and len(batch) > 1 and batch[1].dim() == 1:
            out["label"] = batch[1]
        return out

    def describe_metric(self, key: str, datamodule: Any = None) -> str | None:
        """Words for the zero-shot and retrieval metrics, with the data they were measured on."""
        stage, _, name = key.partition("/")
        split = "validation" if stage == "val" else "test"
        data = getattr(datamodule, "data_name", None)
        if name.startswith("zs_top"):
            n = len(getattr(datamodule, "zeroshot_classnames", None) or [])
            zs_set = _first_set(datamodule, ZEROSHOT_SETS.get(stage, ()))
            return f"{n}-class zero-shot {split} top-{name[6:]}{count_of(zs_set, data or 'images')}"
        if name[:5] in ("i2t_r", "t2i_r"):
            what = "image-to-text" if name.startswith("i2t") else "text-to-image"
            pair_set = _first_set(datamodule, PAIR_SETS.get(stage, ()))
            pairs = count_of(pair_set, f"{data or 'image-text'} pairs", "over")
            return f"{what} {split} retrieval recall@{name[5:]}{pairs}"
        return None

    def _gather_cat(self, t: Tensor) -> Tensor:
        """Concatenate ``t`` over all ranks (the ranks may hold different row counts)."""
        if self.trainer.world_size == 1:
            return t
        n = torch.tensor([len(t)], device=self.device)
        sizes = self.all_gather(n).flatten().tolist()
        pad = torch.zeros((max(sizes) - len(t), *t.shape[1:]), dtype=t.dtype)
        g = self.all_gather(torch.cat([t, pad]).to(self.device))  # (W, max, ...)
        return torch.cat([g[i, :s] for i, s in enumerate(sizes)]).cpu()

    # -- optimisation --------------------------------------------------------------------------
    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW groups: decay on weight matrices only; none on 1-d parameters (gains, biases, lambdas),
        embeddings (token, positional, class), ``logit_scale`` / ``logit_bias`` and the model's
        ``no_weight_decay()`` names."""
        return weight_decay_groups(self.model, self.hparams.weight_decay, NO_DECAY_NAMES)

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        warmup = hp.warmup_steps if hp.warmup_steps is not None else epochs_to_steps(self.trainer, hp.warmup_epochs)
        return adamw_warmup_cosine(self.param_groups(), self.trainer, lr=hp.lr, betas=hp.betas, eps=hp.eps,
                                   warmup_steps=warmup, min_lr_ratio=hp.min_lr_ratio)


def _first_set(datamodule: Any, names: Sequence[str]) -> Any:
    """The first of the attributes ``names`` that ``datamodule`` has and that is not None, else None."""
    for name in names:
        dataset = getattr(datamodule, name, None)
        if dataset is not None:
            return dataset
    return None


class ClipRunSummary(RunSummary):
    """:class:`~diffzoo.tasks.callbacks.RunSummary` for CLIP: ``summary.json`` plus ``model.safetensors``
    holding the open_clip state dict (model name in the header), reloadable with
    :func:`~diffzoo.weights.load_clip` ``(name, checkpoint=path)`` (a model started from a converted folder:
    :func:`~diffzoo.weights.load_clip_weights` into :func:`~diffzoo.weights.load_converted` of that folder).

    Args:
        export: write ``model.safetensors``.
        monitor: metric reported as the headline result.
    """

    def __init__(self, export: bool = True, monitor: str = "val/zs_top1") -> None:
        super().__init__(export=export, monitor=monitor)

    def export_weights(
        self, pl_module: pl.LightningModule, out: Path, state_dict: dict[str, Tensor] | None = None
    ) -> dict[str, str]:
        weights = submodule_state(state_dict, "model.") if state_dict is not None else pl_module.model.state_dict()
        path = save_safetensors(weights, out / "model.safetensors", pl_module.hparams.get("model"),
                                dict(pl_module.model_kwargs))
        return {"safetensors": str(path)}

    def reload_hint(self, pl_module: pl.LightningModule, path: str) -> str:
        init_from = pl_module.hparams.get("init_from")
        if init_from is not None:  # a converted architecture: rebuilt from its folder, then these weights loaded
            return (f"diffzoo.weights.load_clip_weights(diffzoo.weights.load_converted({init_from!r}), {path!r})")
        return f"diffzoo.weights.load_clip({pl_module.hparams.get('model')!r}, checkpoint={path!r})"
