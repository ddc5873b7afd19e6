"""recipes.clip / recipes.clip_zeroshot: short runs on tiny data with a tiny stock open_clip model, resume,
zero-shot scoring of the produced checkpoint, shard configs, and what gradient accumulation computes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from diffzoo.data.image_text import clip_image_settings
from recipes.clip import CONFIG_DIR, cli_main

from conftest import QUIET_CPU_TRAINER, printed_config, train_losses  # tests/ is on sys.path
from test_clip_data import register_tiny_clip  # tests/ is on sys.path (rootdir import mode)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return register_tiny_clip(tmp_path_factory.mktemp("open_clip_configs"))


def _digits_config(path: Path, model: str) -> Path:
    path.write_text(f"""
seed_everything: 0
model:
  model: {model}
  lr: 0.003
  weight_decay: 0.1
  warmup_epochs: 0
data:
  class_path: diffzoo.data.image_text.ColoredDigitsDataModule
  init_args:
    limit: 400
    num_val: 50
    num_test: 100
    num_val_heldout: 50
    batch_size: 50
    colorings: 1
{QUIET_CPU_TRAINER}
""")
    return path


def test_fit_resume_and_zeroshot_of_the_checkpoint(tiny: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _digits_config(tmp_path / "c.yaml", tiny)
    straight = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "2"])
    assert straight.trainer.global_step == 8  # 200 training digits / 50, 2 epochs
    # the data got the built model's tokenizer, input size and normalisation
    assert straight.datamodule.tokenizer is straight.model.tokenizer
    settings = clip_image_settings(straight.model.model)
    assert (straight.datamodule.hparams.image_size, tuple(straight.datamodule.hparams.mean),
            tuple(straight.datamodule.hparams.std)) == settings
    losses = train_losses(straight.trainer.log_dir)
    assert len(losses) == 8 and np.mean(losses[-3:]) < losses[0]
    summary = json.loads(Path(straight.trainer.log_dir, "summary.json").read_text())
    m = summary["metrics"]
    for key in ("val/zs_top1", "val/zs_top5", "val/zs_pair", "val/i2t_r1", "val/i2t_r10", "val/t2i_r5", "val/loss"):
        assert 0.0 <= m[key] <= (1.0 if key != "val/loss" else 10.0), key
    assert m["val/zs_top5"] >= m["val/zs_top1"] and m["val/i2t_r10"] >= m["val/i2t_r1"]
    # the test split, scored after fit with the final weights: zero-shot and retrieval on held-out pairs
    recalls = [m[f"test/{d}_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)]
    assert m["test/mean_recall"] == pytest.approx(sum(recalls) / 6, abs=1e-6)
    assert 0.0 <= m["test/zs_top1"] <= m["test/zs_top5"] <= 1.0 and 0.0 <= m["test/zs_pair"] <= 1.0
    # 100 test images over at most 60 distinct held-out-pair captions: R@10 over the merged captions
    assert m["test/i2t_r10"] >= m["test/i2t_r1"] and 0.0 <= m["test/t2i_r1"] <= 1.0
    assert float(straight.model.model.logit_scale.detach()) <= np.log(100) + 1e-6

    # the same 2-epoch run, stopped after its first epoch (as if killed), then resumed
    class StopAfterFirstEpoch(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = True

    first = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "2"], run=False)
    first.trainer.callbacks.append(StopAfterFirstEpoch())
    first.trainer.fit(first.model, datamodule=first.datamodule)
    last = Path(first.trainer.log_dir, "checkpoints", "last.ckpt")
    assert last.is_file() and first.trainer.global_step == 4
    resumed = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "2", "--ckpt_path", str(last)])
    assert resumed.trainer.global_step == 8 and resumed.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 8
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a), "resumed weights differ from the uninterrupted run"

    # clip_zeroshot on the run's checkpoint: the model name comes from the checkpoint
    from recipes import clip_zeroshot

    folder = tmp_path / "folder"
    for name, rgb in (("red_square", (230, 20, 20)), ("green_square", (20, 200, 20)), ("blue_square", (20, 20, 230))):
        (folder / name).mkdir(parents=True)
        for j in range(2):
            Image.fromarray(np.full((20, 20, 3), rgb, np.uint8)).save(folder / name / f"{j}.png")
    ckpt = summary["last_checkpoint"]
    report = clip_zeroshot.main(["--checkpoint", ckpt, "--embedded", "--limit", "100", "--folder", str(folder),
                                 "--templates", "simple", "--no-progress", "--out", str(tmp_path / "zs.json")])
    assert report["model"] == tiny and json.loads((tmp_path / "zs.json").read_text())["results"] == report["results"]
    emb, fol = report["results"]["embedded"], report["results"]["folder"]
    # the same 100 held-out-pair test digits in the same colours as the run's test: the same score (the last
    # checkpoint holds the final weights, which the test after fit scored)
    assert emb["zs_n"] == 100 and emb["zs_top1"] == pytest.approx(m["test/zs_top1"], abs=1e-6)
    assert emb["zs_pair"] == pytest.approx(m["test/zs_pair"], abs=1e-6)
    assert fol["classes"] == 3 and fol["n"] == 6 and fol["top5"] == 1.0  # top-5 of 3 classes always holds
    exported = clip_zeroshot.main(["--checkpoint", summary["safetensors"], "--embedded", "--limit", "100",
                                   "--no-progress", "--out", str(tmp_path / "zs2.json")])
    assert exported["results"]["embedded"]["zs_top1"] == emb["zs_top1"]


def test_clip_zeroshot_errors(tiny: str, tmp_path: Path, capsys) -> None:
    from recipes import clip_zeroshot

    def error(args: list[str]) -> str:
        with pytest.raises(SystemExit) as e:
            clip_zeroshot.main(args + ["--out", str(tmp_path / "x.json")])
        assert e.value.code == 2
        return capsys.readouterr().err

    assert "unknown open_clip model 'TinyCLIP-tset'" in error(["--model", "TinyCLIP-tset", "--embedded"])
    assert "no such folder" in error(["--model", tiny, "--imagenet-dir", str(tmp_path / "nope")])
    (tmp_path / "in" / "n01440764").mkdir(parents=True)
    assert "1 class folders" in error(["--model", tiny, "--imagenet-dir", str(tmp_path / "in")])
    assert "nothing to evaluate" in error(["--model", tiny])
    no_model = error(["--embedded"])
    assert "--model is required without --checkpoint" in no_model and "checkpoint does not name" not in no_model
    state = tmp_path / "bare.pt"
    torch.save({"visual.proj": torch.zeros(1)}, state)
    assert f"--checkpoint {state} does not name its model: add --model NAME" in error(["--checkpoint", str(state),
                                                                                       "--embedded"])


def test_shard_config_trains_and_scores_folder_and_shards(tiny: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    from diffzoo.data.image_text import write_image_text_shards

    colours = {"red": (230, 20, 20), "green": (20, 200, 20), "blue": (20, 20, 230)}
    pairs = [(np.full((24, 24, 3), rgb, np.uint8), f"a {name} square") for name, rgb in colours.items()] * 4
    write_image_text_shards(pairs, tmp_path / "train-%03d.tar", max_per_shard=6)
    write_image_text_shards(pairs[:6], tmp_path / "val-%03d.tar")
    for name, rgb in colours.items():
        (tmp_path / "zs" / name).mkdir(parents=True)
        Image.fromarray(np.full((24, 24, 3), rgb, np.uint8)).save(tmp_path / "zs" / name / "0.png")
    cli = cli_main([
        "fit", "--config", str(CONFIG_DIR / "clip_cc3m.yaml"), "--model.model", tiny,
        "--data.train_shards", str(tmp_path / "train-{000..001}.tar"), "--data.train_samples", "12",
        "--data.val_shards", str(tmp_path / "val-000.tar"), "--data.zeroshot_dir", str(tmp_path / "zs"),
        "--data.zeroshot_imagenet", "false", "--data.zeroshot_templates", "simple", "--data.batch_size", "6",
        "--data.num_workers", "0", "--data.shuffle_buffer", "1", "--trainer.devices", "1", "--trainer.strategy", "auto",
        "--trainer.accelerator", "cpu", "--trainer.precision", "32", "--trainer.max_steps", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1",
    ])
    assert cli.trainer.global_step == 2 and cli.datamodule.tokenizer is cli.model.tokenizer
    m = cli.trainer.callback_metrics
    assert 0 <= float(m["val/zs_top1"]) <= 1 and float(m["val/zs_top5"]) == 1.0  # 3 classes
    # 3 distinct captions among 6 val pairs, merged: recall@10 over 3 texts always finds the caption
    assert float(m["val/i2t_r10"]) == 1.0 and 0 <= float(m["val/t2i_r1"]) <= 1
    assert cli.datamodule.zeroshot_classnames == ["blue", "green", "red"]
    assert not any(k.startswith("test/") for k in m)  # shards have no test split: no test after fit


def test_print_config_shows_the_default(capsys) -> None:
    out = printed_config(cli_main, capsys)
    assert "model: DiffCLIP-nano" in out and "ColoredDigitsDataModule" in out and "monitor: val/zs_top1" in out


def test_gradient_accumulation_averages_micro_batchtrain_losses(tiny: str, tmp_path: Path) -> None:
    import open_clip

    from diffzoo.tasks.contrastive import ContrastiveTask

    torch.manual_seed(0)
    task = ContrastiveTask(model=tiny, weight_decay=0.0, warmup_steps=1)
    x = torch.randn(16, 3, 32, 32)
    tok = torch.randint(1, 400, (16, 16))
    ref = copy.deepcopy(task.model)
    loss = open_clip.ClipLoss()
    halves = [loss(*ref(x[i : i + 8], tok[i : i + 8])) for i in (0, 8)]
    ((halves[0] + halves[1]) / 2).backward()
    expected = {n: p.grad.clone() for n, p in ref.named_parameters()}
    merged = copy.deepcopy(task.model)
    loss(*merged(x, tok)).backward()

    grads = {}

    class Capture(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            grads.update({n: p.grad.clone() for n, p in pl_module.model.named_parameters()})

    trainer = pl.Trainer(accelerator="cpu", max_steps=1, accumulate_grad_batches=2, callbacks=[Capture()], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(task, train_dataloaders=DataLoader(TensorDataset(x, tok), batch_size=8))
    assert trainer.global_step == 1
    for n, g in expected.items():
        assert torch.allclose(grads[n], g, atol=1e-6, rtol=1e-4), n
    # ... which is not the gradient of one contrastive batch of 16 (negatives stay per micro-batch)
    p = "text_projection"
    assert not torch.allclose(grads[p], dict(merged.named_parameters())[p].grad, atol=1e-6, rtol=1e-4)


def test_default_model_diffclip_nano_trains_through_the_recipe(tmp_path: Path, monkeypatch) -> None:
    """The embedded default's own model (DiffCLIP-nano, differential towers) through the recipe, and its
    exported weights reloaded through open_clip give the same features."""
    import open_clip

    from diffzoo.layers import DiffAttention
    from diffzoo.weights.clip import load_clip

    monkeypatch.chdir(tmp_path)
    cfg = _digits_config(tmp_path / "c.yaml", "DiffCLIP-nano")
    cli = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "1", "--model.lr", "0.001"])
    assert cli.trainer.global_step == 4
    model = cli.model.model
    assert isinstance(model, open_clip.CustomTextCLIP)
    attn = [m for m in model.modules() if isinstance(m, DiffAttention)]
    assert len(attn) == 8  # 4 blocks in each tower
    assert all(m.lambda_init == pytest.approx(0.8) for m in attn)  # DiffCLIP's constant lambda_init
    summary = json.loads(Path(cli.trainer.log_dir, "summary.json").read_text())
    reloaded, _, tokenizer = load_clip("DiffCLIP-nano", checkpoint=summary["safetensors"])
    images = torch.randn(2, 3, 32, 32)
    text = tokenizer(["a red seven on a blue background", "a green one on a white background"])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded.encode_image(images), model.encode_image(images))
        torch.testing.assert_close(reloaded.encode_text(text), model.encode_text(text))


def test_starts_from_a_converted_open_clip_model(tiny: str, tmp_path: Path, monkeypatch) -> None:
    """``--model.init_from DIR`` (``recipes.convert --from open_clip:NAME``): the run starts from the converted
    model (same features as the folder rebuilt by load_converted) and trains it; a wrong name is one line."""
    from diffzoo.tasks.contrastive import ContrastiveTask
    from diffzoo.weights import load_clip_weights, load_converted
    from recipes.convert import main as convert

    monkeypatch.chdir(tmp_path)
    convert(["--from", f"open_clip:{tiny}", "--attn", "diff_v2", "--out", str(tmp_path / "conv")])
    start = load_converted(tmp_path / "conv")
    assert sum(type(m).__name__ == "OpenClipDiffAttentionV2" for m in start.modules()) > 0
    task = ContrastiveTask(model=tiny, init_from=str(tmp_path / "conv"))
    images, text = torch.randn(2, 3, 32, 32), torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        assert torch.equal(task.model.eval().encode_image(images), start.encode_image(images))
        assert torch.equal(task.model.encode_text(text), start.encode_text(text))

    cfg = _digits_config(tmp_path / "c.yaml", tiny)
    cli = cli_main(["fit", "--config", str(cfg), "--trainer.max_steps", "2", "--model.init_from", str(tmp_path / "conv")])
    assert cli.trainer.global_step == 2
    after = cli.model.model.state_dict()
    assert any(not torch.equal(v, after[k]) for k, v in start.state_dict().items())
    summary = json.loads(Path(cli.trainer.log_dir, "summary.json").read_text())
    reloaded = load_converted(tmp_path / "conv")  # the converted architecture, then the trained weights
    load_clip_weights(reloaded, summary["safetensors"])
    with torch.no_grad():
        torch.testing.assert_close(reloaded.encode_image(images), cli.model.model.eval().encode_image(images))
    from diffzoo.tasks.contrastive import ClipRunSummary

    assert "load_converted(" in ClipRunSummary().reload_hint(cli.model, summary["safetensors"])

    with pytest.raises(ValueError, match=r"^--model\.init_from .* was converted from 'TinyCLIP-test', not 'RN50'"):
        ContrastiveTask(model="RN50", init_from=str(tmp_path / "conv"))
    with pytest.raises(ValueError, match=r"^--model\.init_from rebuilds the converted model"):
        ContrastiveTask(model=tiny, init_from=str(tmp_path / "conv"), checkpoint=summary["safetensors"])


def test_partial_tower_config_changes_only_what_it_names() -> None:
    """``--model.model_kwargs '{"vision_cfg": {"width": 64}}'`` narrows the nano's image tower and keeps its image
    size, patch size, depth and attention, with or without ``--model.attn`` (open_clip alone would swap in a whole
    tower config holding only the width)."""
    from diffzoo.tasks.contrastive import ContrastiveTask

    narrow = {"embed_dim": 32, "vision_cfg": {"width": 64}, "text_cfg": {"width": 32, "heads": 2}}
    built = {}
    for attn in (None, "softmax"):
        torch.manual_seed(0)
        task = ContrastiveTask(model="SoftCLIP-nano", attn=attn, model_kwargs=narrow)
        built[attn] = task.model.state_dict()
        vision = task.model_kwargs["vision_cfg"]
        assert (vision["width"], vision["image_size"], vision["patch_size"], vision["layers"]) == (64, 32, 8, 4)
        assert task.model_kwargs["text_cfg"]["layers"] == 4 and task.model_kwargs["text_cfg"]["width"] == 32
    assert built[None].keys() == built["softmax"].keys()
    assert all(torch.equal(built[None][k], built["softmax"][k]) for k in built[None])
    assert sum(v.numel() for v in built[None].values() if v.is_floating_point()) < 1_800_000  # the nano: 3.87 M
