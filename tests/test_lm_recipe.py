"""recipes.lm: a two-step run whose loss goes down, exact resume, export, the retrieval entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from recipes.lm import CONFIG_DIR, cli_main

from conftest import QUIET_CPU_TRAINER, printed_config, train_losses  # tests/ is on sys.path


def _write_config(tmp_path: Path, extra: str = "") -> Path:
    corpus = tmp_path / "corpus.txt"
    from diffzoo.data.text import pydoc_topics_text

    corpus.write_text(pydoc_topics_text()[:40_000])
    path = tmp_path / "lm.yaml"
    path.write_text(f"""
seed_everything: 0
model:
  model: lm_tiny
  lr: 0.01
  warmup_steps: 1
data:
  corpus: {corpus}
  cache_dir: {tmp_path / 'cache'}
  seq_len: 64
  batch_size: 8
  train_windows: 32
  val_windows: 4
  needle_fraction: 0.25
  needle_counts: [1]
{QUIET_CPU_TRAINER}
{extra}
""")
    return path


def test_two_steps_reduce_the_loss(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cli = cli_main(["fit", "--config", str(_write_config(tmp_path)), "--trainer.max_steps", "2"])
    assert cli.trainer.global_step == 2 and cli.model.hparams.vocab_size == 256  # linked from the byte tokenizer
    losses = train_losses(cli.trainer.log_dir)
    assert len(losses) == 2 and losses[1] < losses[0]
    assert list(Path(tmp_path / "cache").glob("corpus-byte-*.bin"))  # tokenised once into a token file
    with pytest.raises(ValueError, match="too short for needle_counts up to 2"):
        cli_main(["fit", "--config", str(_write_config(tmp_path)), "--data.needle_counts", "[1, 2]"])


def test_test_windows_follow_the_validation_windows_and_are_scored_after_fit(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = str(_write_config(tmp_path))
    cli = cli_main(["fit", "--config", cfg, "--trainer.max_steps", "2", "--data.test_windows", "3"])
    data = cli.datamodule
    assert data.has_test_split and len(data.test_set) == 3 and len(data.val_set) == 4
    val, test = set(data.val_set.offsets), set(data.test_set.offsets)
    assert not val & test and min(test) > max(val)  # the windows after the validation ones
    metrics = json.loads(Path(cli.trainer.log_dir, "summary.json").read_text())["metrics"]
    assert metrics["test/loss"] > 0 and metrics["test/ppl"] > 1
    plain = cli_main(["fit", "--config", cfg, "--trainer.max_steps", "2"])
    assert not plain.datamodule.has_test_split and plain.datamodule.val_set.offsets == data.val_set.offsets
    assert "test/loss" not in json.loads(Path(plain.trainer.log_dir, "summary.json").read_text())["metrics"]
    with pytest.raises(ValueError, match="test_windows=1000: the held-out"):
        cli_main(["fit", "--config", cfg, "--trainer.max_steps", "2", "--data.test_windows", "1000"])


def test_resume_continues_exactly_and_exports(tmp_path: Path, monkeypatch) -> None:
    import lightning.pytorch as pl

    monkeypatch.chdir(tmp_path)
    cfg = str(_write_config(tmp_path))
    args = ["fit", "--config", cfg, "--trainer.max_epochs", "2", "--trainer.accumulate_grad_batches", "2"]
    straight = cli_main(args)
    assert straight.trainer.global_step == 4  # 4 batches per epoch, 2 per optimizer step, 2 epochs

    class StopAfterFirstEpoch(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = True

    first = cli_main(args, run=False)
    first.trainer.callbacks.append(StopAfterFirstEpoch())
    first.trainer.fit(first.model, datamodule=first.datamodule)
    assert first.trainer.global_step == 2
    last = Path(first.trainer.log_dir, "checkpoints", "last.ckpt")
    resumed = cli_main([*args, "--ckpt_path", str(last)])
    assert resumed.trainer.global_step == 4 and resumed.trainer.current_epoch == 2
    assert resumed.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 4  # schedule continued
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), f"{k} differs after resume"
    assert train_losses(resumed.trainer.log_dir)[-2:] == pytest.approx(train_losses(straight.trainer.log_dir)[-2:], abs=1e-5)

    summary = json.loads(Path(resumed.trainer.log_dir, "summary.json").read_text())
    metrics = summary["metrics"]
    assert metrics["val/ppl"] == pytest.approx(torch.exp(torch.tensor(metrics["val/loss"])).item(), rel=1e-5)
    from diffzoo.weights.export import load_lm

    model = load_lm(summary["safetensors"]).eval()
    x = torch.randint(0, 256, (2, 16))
    assert torch.allclose(model(x), resumed.model.model.eval()(x), atol=1e-6)

    from recipes.lm_retrieval import main

    rows = main(["--weights", summary["safetensors"], "--corpus", str(tmp_path / "corpus.txt"), "--lengths", "64",
                 "--needles", "1", "--depths", "0.5", "--samples", "2", "--json", str(tmp_path / "r.json")])
    assert len(rows) == 1 and rows[0]["n"] == 2 and json.loads((tmp_path / "r.json").read_text()) == rows


def test_print_config_shows_the_default(capsys) -> None:
    out = printed_config(cli_main, capsys)
    assert "lm_tiny" in out and "needle_fraction: 0.5" in out and (CONFIG_DIR / "lm_pydoc.yaml").is_file()
