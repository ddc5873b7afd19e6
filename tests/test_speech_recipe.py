"""recipes.speech_commands: a short run on a few synthesised clips, summary and export, every config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from recipes.speech_commands import CONFIG_DIR, cli_main

from conftest import printed_config, train_losses  # tests/ is on sys.path
from test_speech_data import TINY_WORDS, make_speech_commands, tiny_synth_config  # tests/ is on sys.path

TINY_MODEL = '{"depth": 1, "embed_dim": 32, "num_heads": 2, "patch_time": 4}'


def test_short_run_on_synthesised_clips_reduces_the_loss(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    import diffzoo.data.speech as speech_data

    # a 12-word vocabulary (every 12-class label) with 3 training clips per word keeps synthesis to a second
    monkeypatch.setattr(speech_data, "SynthConfig", lambda **kw: tiny_synth_config(tuple(kw["clips_per_word"])))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
seed_everything: 0
model:
  model: diffkwt_nano
  model_kwargs: {TINY_MODEL}
  lr: 0.003
  warmup_epochs: 0
data:
  class_path: diffzoo.data.speech.SynthKeywordsDataModule
  init_args:
    clips_per_word: [3, 1, 1]
    silence_clips: [3, 1, 1]
    snr_db: [20.0, 30.0]
    batch_size: 36
trainer:
  accelerator: cpu
  max_steps: 8
  log_every_n_steps: 1
  num_sanity_val_steps: 0
  enable_progress_bar: false
  enable_model_summary: false
""")
    cli = cli_main(["fit", "--config", str(cfg)])
    assert len(TINY_WORDS) == 12 and len(cli.datamodule.train_set) == 36  # 3 per class, one batch
    assert cli.trainer.global_step == 8 and cli.model.hparams.num_classes == 12
    losses = train_losses(cli.trainer.log_dir)
    assert len(losses) == 8 and sum(losses[-2:]) < sum(losses[:2]), losses
    summary = json.loads(Path(cli.trainer.log_dir, "summary.json").read_text())
    assert 0.0 <= summary["metrics"]["test/top1"] <= 1.0 and "val/top1" in summary["metrics"]
    assert summary["metrics"]["data/bad_samples"] == 0
    assert list(tmp_path.glob("data/cache/speech_synth/synth_keywords_*.pt"))  # cached under the run folder
    # the exported safetensors reload through timm and give the task's logits
    from diffzoo.weights.export import load_exported

    model = load_exported(summary["safetensors"]).eval()
    wave, lengths = torch.randn(2, 16000) * 0.1, torch.tensor([16000, 12000])
    assert torch.allclose(model(wave, lengths), cli.model.eval()(wave, lengths), atol=1e-6)


def test_print_config_shows_the_default(capsys) -> None:
    out = printed_config(cli_main, capsys)
    assert "diffkwt_nano" in out and "SynthKeywordsDataModule" in out and "max_epochs: 12" in out


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIG_DIR.glob("speech_*.yaml")))
def test_every_config_instantiates(config: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    text = (CONFIG_DIR / config).read_text()
    args = ["--config", str(CONFIG_DIR / config), "--trainer.precision", "32-true"]
    if "SpeechCommandsDataModule" in text:
        args += ["--data.data_dir", str(make_speech_commands(tmp_path / "sc"))]
    cli = cli_main(["fit", *args], run=False)
    logits = cli.model(torch.zeros(1, 16000))
    assert logits.shape == (1, cli.datamodule.num_classes) == (1, 12)
