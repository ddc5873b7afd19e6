"""diffzoo.tasks.optim: the one AdamW + warm-up/cosine set-up of every task."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from diffzoo.tasks.optim import adamw_warmup_cosine, epochs_to_steps, warmup_cosine, weight_decay_groups


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(5, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.pos_embed = nn.Parameter(torch.zeros(1, 3, 4))
        self.logit_scale = nn.Parameter(torch.ones([]))
        self.frozen = nn.Parameter(torch.zeros(4, 4), requires_grad=False)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}


def _names(model: nn.Module, group: dict) -> set[str]:
    ids = {id(p) for p in group["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_weight_decay_groups_split_matrices_from_the_rest() -> None:
    net = _Net()
    decay, no_decay = weight_decay_groups(net, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert _names(net, decay) == {"embedding.weight", "proj.weight"}  # 2-d, not named by no_weight_decay()
    assert _names(net, no_decay) == {"proj.bias", "norm.weight", "norm.bias", "pos_embed", "logit_scale"}
    # substrings (CLIP's names) and a decay of 0 keep the two groups and their order
    decay, no_decay = weight_decay_groups(net, 0.0, ("embedding",))
    assert _names(net, decay) == {"proj.weight"} and "embedding.weight" in _names(net, no_decay)
    assert decay["weight_decay"] == 0.0


def test_the_schedule_gives_the_closed_form_at_every_step(tmp_path) -> None:
    """Warm-up from lr/W to lr over W steps, cosine to min_ratio * lr by the last step, then held."""

    class Task(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(3, 1)
            self.lrs: list[float] = []

        def training_step(self, batch, batch_idx):
            self.lrs.append(self.optimizers().param_groups[0]["lr"])
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return adamw_warmup_cosine(weight_decay_groups(self.net, 0.1), self.trainer, lr=0.01, betas=(0.9, 0.99),
                                       warmup_steps=epochs_to_steps(self.trainer, 0.5), min_lr_ratio=0.1)

    task = Task()
    data = DataLoader(TensorDataset(torch.randn(40, 3)), batch_size=4)  # 10 steps per epoch
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(task, data)
    warmup, total = 5, 20
    expected = []
    for step in range(total):
        if step < warmup:
            expected.append(0.01 * (step + 1) / warmup)
        else:
            t = (step - warmup) / (total - warmup)
            expected.append(0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))))
    assert task.lrs == pytest.approx(expected, rel=1e-12, abs=0)
    assert warmup_cosine(total + 7, warmup, total, 0.1) == pytest.approx(0.1)  # held after the last step
    opt = trainer.optimizers[0]
    assert opt.defaults["betas"] == (0.9, 0.99) and [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_epochs_to_steps_without_max_epochs_uses_the_loader_length() -> None:
    class Task(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            self.warmup = epochs_to_steps(self.trainer, 1.5)
            return torch.optim.SGD(self.parameters(), lr=0.1)

    task = Task()
    data = DataLoader(TensorDataset(torch.randn(24, 3)), batch_size=4)  # 6 batches, 3 optimizer steps per epoch
    trainer = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", accumulate_grad_batches=2)
    trainer.fit(task, data)
    assert trainer.max_epochs == -1 and task.warmup == round(1.5 * 3)


def test_speech_task_only_unpacks_its_batches() -> None:
    """The speech task reuses the classification steps; its batches reach the model through split_batch."""
    from diffzoo.tasks import ImageClassificationTask, SpeechClassificationTask

    for hook in ("training_step", "validation_step", "test_step", "predict_step", "on_train_epoch_end"):
        assert getattr(SpeechClassificationTask, hook) is getattr(ImageClassificationTask, hook), hook
    task = SpeechClassificationTask(model_kwargs={"depth": 1, "embed_dim": 32, "num_heads": 2, "patch_time": 4}).eval()
    wave, y, lengths = torch.randn(2, 16000) * 0.1, torch.tensor([1, 2]), torch.tensor([16000, 8000])
    (inputs, labels) = task.split_batch((wave, y, lengths))
    assert inputs[0] is wave and inputs[1] is lengths and labels is y
    out = task.predict_step((wave, y, lengths), 0)
    assert torch.equal(out["label"], y) and torch.equal(out["prediction"], task(wave, lengths).argmax(-1))
