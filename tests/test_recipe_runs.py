"""What every LightningCLI recipe does around training: validate / test / predict, fast_dev_run, best + last
checkpoints, the headline metric's description, progress lines, curves and TensorBoard, --help, quiet runs."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path

import pytest
import torch

import recipes.clip as clip_recipe
import recipes.lm as lm_recipe
import recipes.speech_commands as speech_recipe
import recipes.vit_imagenet as vit_recipe

from test_clip_data import register_tiny_clip  # tests/ is on sys.path (rootdir import mode)
from test_clip_recipe import _digits_config as clip_config
from test_lm_recipe import _write_config as lm_config
from test_speech_data import tiny_synth_config
from test_speech_recipe import TINY_MODEL as SPEECH_TINY_MODEL
from test_vit_recipe import _digits_config as vit_config


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _run_folders(tmp_path: Path, name: str) -> list[Path]:
    return sorted(tmp_path.glob(f"outputs/{name}/version_*"))


# -- fit, then validate / test / predict of its checkpoint ---------------------------------------
def test_vit_fit_keeps_best_and_last_then_validate_test_predict(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = str(vit_config(tmp_path))
    fit = vit_recipe.cli_main(["fit", "--config", cfg, "--trainer.max_epochs", "3"])
    run = Path(fit.trainer.log_dir)
    ckpts = sorted(p.name for p in (run / "checkpoints").glob("*.ckpt"))
    assert len(ckpts) == 2 and "last.ckpt" in ckpts  # best by val/top1 and last, not one per epoch
    best = fit.trainer.checkpoint_callback
    assert best.monitor == "val/top1" and best.mode == "max"
    scores = [float(r["val/top1"]) for r in _rows(run / "metrics.csv") if r.get("val/top1")]
    assert float(best.best_model_score) == pytest.approx(max(scores))

    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["monitor_description"] == "10-class validation top-1 on 100 MNIST digits"
    assert "val/top1: " in out and "(10-class validation top-1 on 100 MNIST digits)" in out
    # a line per epoch (capsys is not a terminal) with the epoch's metrics
    epoch_lines = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert [ln.split()[1] for ln in epoch_lines] == ["1/3", "2/3", "3/3"]
    assert all("train/loss" in ln and "val/top1" in ln for ln in epoch_lines)
    # curves and TensorBoard beside the CSV
    assert (run / "curves.png").stat().st_size > 0 and list((run / "tensorboard").glob("events.out.tfevents.*"))
    for line in ("metrics log: ", "curves: ", "summary: "):
        paths = [ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith(line)]
        assert paths and all(Path(p).exists() for p in paths), line

    ckpt = str(run / "checkpoints" / "last.ckpt")
    val = vit_recipe.cli_main(["validate", "--config", cfg, "--ckpt_path", ckpt])
    assert val.trainer.callback_metrics["val/top1"] == pytest.approx(summary["metrics"]["val/top1"], abs=1e-6)
    test = vit_recipe.cli_main(["test", "--config", cfg, "--ckpt_path", ckpt])
    assert test.trainer.callback_metrics["test/top1"] == pytest.approx(summary["metrics"]["val/top1"], abs=1e-6)
    test_line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("test  "))
    assert "test/loss" in test_line and "test/top1" in test_line
    pred = vit_recipe.cli_main(["predict", "--config", cfg, "--ckpt_path", ckpt])
    rows = _rows(Path(pred.trainer.log_dir) / "predictions.csv")
    assert len(rows) == 100 and list(rows[0]) == ["row", "prediction", "probability", "label"]
    accuracy = sum(r["prediction"] == r["label"] for r in rows) / len(rows)
    assert accuracy == pytest.approx(summary["metrics"]["val/top1"], abs=1e-6)
    assert all(0.0 < float(r["probability"]) <= 1.0 for r in rows)


def test_lm_test_and_predict(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = str(lm_config(tmp_path))
    fit = lm_recipe.cli_main(["fit", "--config", cfg, "--trainer.max_epochs", "1"])
    summary = json.loads(Path(fit.trainer.log_dir, "summary.json").read_text())
    assert summary["monitor"] == "val/loss" and "next-token cross-entropy" in summary["monitor_description"]
    ckpt = summary["last_checkpoint"]
    test = lm_recipe.cli_main(["test", "--config", cfg, "--ckpt_path", ckpt])
    test_loss = float(test.trainer.callback_metrics["test/loss"])
    assert test_loss == pytest.approx(summary["metrics"]["val/loss"], rel=1e-5)  # the held-out windows
    pred = lm_recipe.cli_main(["predict", "--config", cfg, "--ckpt_path", ckpt])
    rows = _rows(Path(pred.trainer.log_dir) / "predictions.csv")
    assert len(rows) == len(pred.datamodule.val_set) and list(rows[0]) == ["row", "loss", "accuracy"]
    assert sum(float(r["loss"]) for r in rows) / len(rows) == pytest.approx(test_loss, rel=1e-4)


def test_speech_predict_writes_the_test_clips(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    import diffzoo.data.speech as speech_data

    monkeypatch.setattr(speech_data, "SynthConfig", lambda **kw: tiny_synth_config(tuple(kw["clips_per_word"])))
    args = ["--model.model_kwargs", SPEECH_TINY_MODEL, "--data.init_args.clips_per_word", "[3, 1, 1]",
            "--data.init_args.silence_clips", "[3, 1, 1]", "--data.init_args.batch_size", "36",
            "--trainer.enable_model_summary", "false"]
    fit = speech_recipe.cli_main(["fit", *args, "--trainer.max_steps", "1"])
    ckpt = fit.trainer.checkpoint_callback.last_model_path
    pred = speech_recipe.cli_main(["predict", *args, "--ckpt_path", ckpt])
    rows = _rows(Path(pred.trainer.log_dir) / "predictions.csv")
    test_set = pred.datamodule.test_set
    labels = [int(test_set[i][1]) for i in range(len(test_set))]
    assert [int(r["label"]) for r in rows] == labels and all(0 <= int(r["prediction"]) < 12 for r in rows)


def test_clip_test_and_predict(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    tiny = register_tiny_clip(tmp_path / "configs")
    cfg = str(clip_config(tmp_path / "c.yaml", tiny))
    fit = clip_recipe.cli_main(["fit", "--config", cfg, "--trainer.max_epochs", "1"])
    summary = json.loads(Path(fit.trainer.log_dir, "summary.json").read_text())
    # model selection on the 50 held-out-pair validation digits, the test after fit on the 100 test digits
    assert summary["monitor_description"].startswith("300-class zero-shot validation top-1 on 50 coloured")
    describe = fit.model.describe_metric
    assert describe("test/zs_top1", fit.datamodule) == "300-class zero-shot test top-1 on 100 coloured MNIST digits"
    assert describe("test/i2t_r1", fit.datamodule).endswith("test retrieval recall@1 over 100 coloured MNIST digits pairs")
    assert describe("val/t2i_r5", fit.datamodule).endswith("validation retrieval recall@5 over 50 coloured MNIST digits pairs")
    m = summary["metrics"]
    ckpt = summary["last_checkpoint"]
    test = clip_recipe.cli_main(["test", "--config", cfg, "--ckpt_path", ckpt])
    for key in ("test/zs_top1", "test/zs_pair", "test/i2t_r1", "test/t2i_r1", "test/mean_recall"):
        assert float(test.trainer.callback_metrics[key]) == pytest.approx(m[key], abs=1e-6), key
    pred = clip_recipe.cli_main(["predict", "--config", cfg, "--ckpt_path", ckpt])
    rows = _rows(Path(pred.trainer.log_dir) / "predictions.csv")
    names = pred.datamodule.zeroshot_classnames
    assert len(rows) == 100 and all(names[int(r["prediction"])] == r["class_name"] for r in rows)
    assert [int(r["label"]) for r in rows] == pred.datamodule.test_set.labels.tolist()
    accuracy = sum(r["prediction"] == r["label"] for r in rows) / len(rows)
    assert accuracy == pytest.approx(m["test/zs_top1"], abs=1e-6)


# -- fast_dev_run ------------------------------------------------------------------------------
def test_fast_dev_run_saves_nothing_and_claims_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    cli = vit_recipe.cli_main(["fit", "--config", str(vit_config(tmp_path)), "--trainer.fast_dev_run", "true"])
    assert cli.trainer.global_step == 1
    written = [p for p in tmp_path.rglob("*") if p.suffix in (".safetensors", ".json", ".csv", ".ckpt", ".png")]
    assert written == []
    out = capsys.readouterr().out
    assert "fast_dev_run: " in out and "nothing was saved" in out
    assert "metrics log" not in out and "weights:" not in out and "checkpoint:" not in out


# -- help ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe, shown", [
    (vit_recipe, ("default: 0.003", "diffzoo.data.DigitsDataModule", "default: 15")),
    (lm_recipe, ("default: lm_tiny", "default: 0.003", "default: 3)")),
])
def test_fit_help_shows_the_defaults_the_run_uses_and_the_configs(recipe, shown, capsys) -> None:
    with pytest.raises(SystemExit):
        recipe.cli_main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # help text wraps lines
    for text in shown:
        assert text in out, text
    for config in recipe.CONFIG_DIR.glob(f"{recipe.DEFAULT_CONFIG.name.split('_')[0]}_*.yaml"):
        assert config.name in out
    assert f"{recipe.DEFAULT_CONFIG.name} (default)" in out
    with pytest.raises(SystemExit):
        recipe.cli_main(["--help"])
    main_help = capsys.readouterr().out
    assert "With no arguments, trains" in main_help and recipe.DEFAULT_CONFIG.name in main_help


def test_a_named_config_replaces_the_default_one(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cli = vit_recipe.cli_main(["fit", "--config", str(vit_config(tmp_path))], run=False)
    assert cli.trainer.max_epochs != 15  # vit_digits.yaml's value does not leak into another config
    default = vit_recipe.cli_main([], run=False)
    assert default.trainer.max_epochs == 15 and default.model.hparams.lr == 0.003


# -- quiet runs, plots without matplotlib ------------------------------------------------------
def test_no_cloud_logger_advert_or_leafspec_warning_and_plots_skipped_without_matplotlib(
    tmp_path: Path, monkeypatch, capsys, caplog, recwarn
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    caplog.set_level(logging.INFO)
    cli = vit_recipe.cli_main(["fit", "--config", str(vit_config(tmp_path)), "--trainer.max_steps", "1"])
    assert cli.trainer.global_step == 1
    assert "Seed set to 0" in caplog.text  # Lightning's other messages still come through
    assert "litlogger" not in caplog.text
    assert not [w for w in recwarn if "LeafSpec" in str(w.message)]
    out = capsys.readouterr().out
    assert "plots skipped: matplotlib is not installed" in out
    assert not (Path(cli.trainer.log_dir) / "curves.png").exists()


def test_progress_lines_every_n_steps(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    vit_recipe.cli_main(["fit", "--config", str(vit_config(tmp_path)), "--trainer.max_steps", "4",
                         "--progress.every_n_steps", "2"])
    steps = [ln.split()[1] for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert steps == ["2", "4"]


def test_lambda_by_depth_is_read_from_differential_layers() -> None:
    import timm

    import diffzoo.models  # noqa: F401
    from diffzoo.tasks.callbacks import layer_lambdas

    diff = timm.create_model("diffvit_nano_patch7_28", num_classes=10, in_chans=1)
    lams = layer_lambdas(diff)
    attn = [m for m in diff.modules() if hasattr(m, "lambda_full")]
    assert len(lams) == len(attn) > 1 and lams == [pytest.approx(float(m.lambda_full())) for m in attn]
    assert layer_lambdas(timm.create_model("softvit_nano_patch7_28")) == []
    assert torch.is_grad_enabled()


def test_last_checkpoint_follows_the_run_when_the_monitored_metric_stops_improving(tmp_path: Path) -> None:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from diffzoo.tasks.callbacks import BestAndLastCheckpoint

    class Constant(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.w(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("val/score", 1.0)  # never improves after the first epoch

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    ckpt = BestAndLastCheckpoint(dirpath=tmp_path, monitor="val/score", mode="max", save_top_k=1, save_last=True)
    trainer = pl.Trainer(max_epochs=3, callbacks=[ckpt], logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Constant(), data, data)
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 6  # the end of the run
    assert torch.load(ckpt.best_model_path, weights_only=True)["global_step"] == 2  # the best (first) epoch


def test_export_writes_the_weights_the_strategy_gathers(tmp_path: Path, monkeypatch) -> None:
    """Under FSDP each rank holds a shard and only ``strategy.lightning_module_state_dict()`` (a collective
    call) returns the whole model: the export must write that dict, not the rank's own module state. Here a
    one-device strategy stands in for the gathering one and returns every weight plus one."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import SingleDeviceStrategy
    from safetensors.torch import load_file

    from diffzoo.tasks.callbacks import RunSummary

    class Gathering(SingleDeviceStrategy):
        calls = 0

        def lightning_module_state_dict(self):
            Gathering.calls += 1
            return {k: v + 1 for k, v in self.lightning_module.state_dict().items()}

    monkeypatch.chdir(tmp_path)
    cli = vit_recipe.cli_main(["fit", "--config", str(vit_config(tmp_path))], run=False)
    summary = RunSummary()
    trainer = pl.Trainer(strategy=Gathering(device="cpu"), max_steps=1, callbacks=[summary],
                         logger=pl.loggers.CSVLogger(tmp_path / "logs"), enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, limit_val_batches=1)
    trainer.fit(cli.model, datamodule=cli.datamodule)
    assert Gathering.calls == 1
    exported = load_file(summary.summary["safetensors"])
    own = cli.model.model.state_dict()
    assert exported.keys() == own.keys()
    assert all(torch.equal(exported[k], own[k] + 1) for k in own)


def test_curves_plot_metrics_not_sample_counts():
    from diffzoo.tasks.callbacks import plotted_metrics

    epochs = [(10, {"val/loss": 1.0, "val/top1": 0.5, "val/top5": 0.9, "val/evaluated": 1000.0, "val/skipped": 0.0,
                    "train/loss_epoch": 1.1})]
    assert plotted_metrics(epochs) == ["val/top1", "val/top5"]
