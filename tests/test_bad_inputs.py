"""Bad inputs per entry point, each with the message a user gets: files that would run code when unpickled,
empty and foreign files, a diverging run, an epoch without batches, a binary corpus, NaN predictions."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from test_clip_data import register_tiny_clip  # tests/ is on sys.path (rootdir import mode)
from test_data_vision import make_folder, make_shards
from test_lm_recipe import _write_config as lm_config
from test_speech_data import tiny_synth_config
from test_vit_recipe import TINY_MODEL as TINY_VIT
from test_vit_recipe import _digits_config as vit_digits_config

REPO = Path(__file__).resolve().parents[1]


class RunsCode:
    """Unpickling this object calls ``exec``, which creates the marker file (what an attack would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> str:
    return register_tiny_clip(tmp_path_factory.mktemp("open_clip_configs"))


def _malicious(folder: Path, kind: str) -> tuple[Path, Path]:
    """``(file, marker)``: a checkpoint-looking file whose unpickling would create ``marker``."""
    marker = folder / f"ran-{kind}"
    payload = {"state_dict": {"model.w": torch.zeros(2)}, "hyper_parameters": {"model": "x"}, "x": RunsCode(marker)}
    path = folder / {"zip": "evil.ckpt", "legacy": "evil.pt", "raw": "evil.pkl", "safetensors": "evil.safetensors"}[kind]
    if kind == "zip":
        torch.save(payload, path)
    elif kind == "legacy":
        torch.save(payload, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps(payload))
    return path, marker


# -- every public loading path refuses a file that would run code -------------------------------
def _library_loaders(tmp: Path, tiny_clip: str) -> dict[str, Callable[[Path], object]]:
    import diffzoo.weights as weights

    return {
        "load_clip_weights": lambda p: weights.load_clip_weights(nn.Linear(2, 2), p),
        "load_clip": lambda p: weights.load_clip(tiny_clip, checkpoint=p),
        "checkpoint_model_name": weights.checkpoint_model_name,
        "export_checkpoint": lambda p: weights.export_checkpoint(p, tmp / "out.safetensors"),
        "load_diffclip_checkpoint": weights.load_diffclip_checkpoint,
        "load_torch_file": weights.load_torch_file,
        "read_weights": weights.read_weights,
        "load_lm": weights.load_lm,
        "load_exported": weights.load_exported,
        "read_metadata": weights.read_metadata,
    }


LIBRARY_LOADERS = ["load_clip_weights", "load_clip", "checkpoint_model_name", "export_checkpoint",
                   "load_diffclip_checkpoint", "load_torch_file", "read_weights", "load_lm", "load_exported",
                   "read_metadata"]


@pytest.mark.parametrize("kind", ["zip", "legacy", "raw", "safetensors"])
@pytest.mark.parametrize("loader", LIBRARY_LOADERS)
def test_library_loaders_never_run_code_from_a_file(loader: str, kind: str, tmp_path: Path, tiny_clip: str) -> None:
    path, marker = _malicious(tmp_path, kind)
    with pytest.raises(ValueError) as info:
        _library_loaders(tmp_path, tiny_clip)[loader](path)
    assert not marker.exists(), f"{loader} ran code from {path}"
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    if kind in ("zip", "legacy") and loader not in ("load_lm", "load_exported", "read_metadata"):
        assert "pickled objects (builtins.exec)" in message and "only tensors and plain values" in message


def _clip_zeroshot(args: list[str]) -> None:
    from recipes.clip_zeroshot import main

    main(args)


def _lm_retrieval(args: list[str]) -> None:
    from recipes.lm_retrieval import main

    main(args)


def _recipe(module: str, subcommand: str = "fit") -> Callable[[list[str]], object]:
    def run(args: list[str]) -> object:
        import importlib

        return importlib.import_module(f"recipes.{module}").cli_main([subcommand, *args])

    return run


UNSAFE = "pickled objects (builtins.exec)"
# (entry point, arguments with {file} for the malicious file, expected message)
RECIPE_LOADERS = [
    ("lm fit", _recipe("lm"), ["--ckpt_path", "{file}"], UNSAFE),
    ("lm validate", _recipe("lm", "validate"), ["--config", str(REPO / "recipes/configs/lm_pydoc.yaml"),
                                                "--ckpt_path", "{file}"], UNSAFE),
    ("vit_imagenet fit", _recipe("vit_imagenet"), ["--ckpt_path", "{file}"], UNSAFE),
    ("clip fit", _recipe("clip"), ["--ckpt_path", "{file}"], UNSAFE),
    ("speech_commands fit", _recipe("speech_commands"), ["--ckpt_path", "{file}"], UNSAFE),
    ("clip fit --model.checkpoint", _recipe("clip"), ["--model.checkpoint", "{file}", "--model.model", "{tiny}"], UNSAFE),
    ("clip_zeroshot --model", _clip_zeroshot, ["--model", "{tiny}", "--checkpoint", "{file}", "--embedded"], UNSAFE),
    ("clip_zeroshot", _clip_zeroshot, ["--checkpoint", "{file}", "--embedded"], UNSAFE),
    ("lm_retrieval", _lm_retrieval, ["--weights", "{file}"], "is not a safetensors file"),
]


@pytest.mark.parametrize("kind", ["zip", "legacy"])
@pytest.mark.parametrize("name,entry,args,expected", RECIPE_LOADERS, ids=[r[0] for r in RECIPE_LOADERS])
def test_recipe_command_lines_never_run_code_from_a_file(
    name: str, entry: Callable, args: list[str], expected: str, kind: str, tmp_path: Path, tiny_clip: str, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    path, marker = _malicious(tmp_path, kind)
    with pytest.raises((ValueError, SystemExit)) as info:
        entry([a.format(file=path, tiny=tiny_clip) for a in args])
    assert not marker.exists(), f"{name} ran code from {path}"
    message = str(info.value) if isinstance(info.value, ValueError) else capsys.readouterr().err
    assert expected in message, message


def test_library_resume_reads_checkpoints_safely(tmp_path: Path) -> None:
    """``Trainer.fit(task, ckpt_path=...)`` without the recipes: the task's guard installs the safe reader."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from diffzoo.tasks import ImageClassificationTask

    path, marker = _malicious(tmp_path, "zip")
    task = ImageClassificationTask(model_kwargs=json.loads(TINY_VIT), num_classes=3, in_chans=1)
    data = DataLoader(TensorDataset(torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 0])), batch_size=2)
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.raises(ValueError, match="pickled objects"):
        trainer.fit(task, train_dataloaders=data, ckpt_path=path)
    assert not marker.exists()


def test_published_training_arguments_load_without_trusting_the_file(tmp_path: Path) -> None:
    """argparse.Namespace (training arguments in published checkpoints) is rebuilt without unpickling code."""
    import argparse

    from diffzoo.weights.io import load_torch_file

    torch.save({"state_dict": {"w": torch.ones(2)}, "args": argparse.Namespace(lr=0.1, model="ViT-B-16")}, tmp_path / "a.pt")
    loaded = load_torch_file(tmp_path / "a.pt")
    assert loaded["args"].lr == 0.1 and torch.equal(loaded["state_dict"]["w"], torch.ones(2))


# -- one-line errors for files that are not what a flag expects ---------------------------------
def _vit_export(path: Path) -> Path:
    from diffzoo.weights.export import save_safetensors

    return save_safetensors({"head.weight": torch.zeros(3, 4)}, path, "diffvit_nano_patch7_28", {"num_classes": 3})


def _lm_export(path: Path) -> Path:
    from diffzoo.weights.export import save_safetensors

    return save_safetensors({"tok_embeddings.weight": torch.zeros(4, 2)}, path, "lm_tiny", {"dim": 2})


def _no_metadata(path: Path) -> Path:
    from safetensors.torch import save_file

    save_file({"tok_embeddings.weight": torch.zeros(4, 2)}, str(path))
    return path


def _plain_state_dict(path: Path) -> Path:
    torch.save({"model.w": torch.zeros(2)}, path)
    return path


def _content(data: bytes) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        path.write_bytes(data)
        return path

    return write


# (entry point, file maker, expected message fragment)
BAD_FILES = [
    ("--ckpt_path", _content(b""), "is empty (0 bytes)"),
    ("--ckpt_path", _content(b"not a checkpoint\n"), "is not a PyTorch checkpoint"),
    ("--ckpt_path", _content(b"PK\x03\x04 truncated zip"), "is not a readable PyTorch checkpoint"),
    ("--ckpt_path", _plain_state_dict, "is not a Lightning checkpoint (no 'state_dict')"),
    ("lm_retrieval --weights", _vit_export, "holds a 'diffvit_nano_patch7_28' model, not a diffzoo language model"),
    ("lm_retrieval --weights", _no_metadata, "has no diffzoo metadata"),
    ("load_lm", _no_metadata, "has no diffzoo metadata (model, model_args)"),
    ("load_lm", _vit_export, "not a diffzoo language model"),
    ("load_lm", _content(b"{}"), "is not a safetensors file"),
    ("load_exported", _content(b""), "is not a safetensors file"),
    ("load_exported", _lm_export, "load it with diffzoo.weights.load_lm"),
    ("load_clip_weights", _content(b""), "is empty (0 bytes)"),
    ("load_clip_weights", _content(b"garbage"), "is not a valid safetensors file"),
]


@pytest.mark.parametrize("entry,make,fragment", BAD_FILES, ids=[f"{e}-{f}" for e, _, f in BAD_FILES])
def test_bad_files_get_one_line_errors(entry: str, make: Callable, fragment: str, tmp_path: Path, monkeypatch,
                                       capsys) -> None:
    monkeypatch.chdir(tmp_path)
    suffix = ".ckpt" if entry == "--ckpt_path" else ".safetensors"
    path = make(tmp_path / f"file{suffix}")
    with pytest.raises((ValueError, SystemExit)) as info:
        if entry == "--ckpt_path":
            from recipes.lm import cli_main

            cli_main(["fit", "--config", str(lm_config(tmp_path)), "--trainer.max_steps", "1", "--ckpt_path", str(path)])
        elif entry == "lm_retrieval --weights":
            _lm_retrieval(["--weights", str(path)])
        elif entry == "load_lm":
            from diffzoo.weights import load_lm

            load_lm(path)
        elif entry == "load_exported":
            from diffzoo.weights import load_exported

            load_exported(path)
        else:
            from diffzoo.weights import load_clip_weights

            load_clip_weights(nn.Linear(2, 2), path)
    message = str(info.value) if isinstance(info.value, ValueError) else capsys.readouterr().err
    assert fragment in message and str(path.name) in message, message


# -- bad settings -------------------------------------------------------------------------------
BAD_SETTINGS = [
    (["--data.seq_len", "0"], "data.seq_len=0 must be a positive integer"),
    (["--data.batch_size", "0"], "data.batch_size=0 must be a positive integer"),
    (["--data.train_windows", "4"], "data.train_windows=4 gives 4 training samples per device, fewer than batch_size=8"),
]


@pytest.mark.parametrize("args,fragment", BAD_SETTINGS, ids=[a[0] for a, _ in BAD_SETTINGS])
def test_lm_recipe_refuses_bad_settings_before_training(args: list[str], fragment: str, tmp_path: Path,
                                                        monkeypatch) -> None:
    from recipes.lm import cli_main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        cli_main(["fit", "--config", str(lm_config(tmp_path)), *args])
    assert not list(tmp_path.rglob("model.safetensors")) and not list(tmp_path.rglob("*.ckpt"))


def _zero_batch_modules(tmp: Path) -> list[tuple[str, Callable[[], object], str]]:
    import open_clip

    from diffzoo.data import DigitsDataModule, ImageFolderDataModule, ShardDataModule
    from diffzoo.data.image_text import ColoredDigitsDataModule
    from diffzoo.data.text import TextDataModule

    tokenizer = open_clip.get_tokenizer("DiffCLIP-nano")
    corpus = tmp / "c.txt"
    corpus.write_text("hello world, some text. " * 400)
    folder = make_folder(tmp / "folder", per_class=2, classes=3)
    shards = make_shards(tmp / "shards", n_shards=2, per_shard=5)
    common = dict(img_size=16, num_workers=0, auto_augment=None, re_prob=0.0)
    return [
        ("text", lambda: TextDataModule(corpus=str(corpus), cache_dir=str(tmp / "cache"), seq_len=16, batch_size=16,
                                        train_windows=8), "data.train_windows=8 gives 8 training samples"),
        ("digits", lambda: DigitsDataModule(limit=40, num_val=20, batch_size=32), "(20 digits: limit=40, num_val=20, num_test=0)"),
        ("folder", lambda: ImageFolderDataModule(str(folder), batch_size=8, **common), "(6 images)"),
        ("shards", lambda: ShardDataModule(shards, shards, num_classes=3, train_samples=10, batch_size=4,
                                           **{**common, "num_workers": 4}),
         "2 per DataLoader worker (4 workers"),
        ("coloured digits", lambda: ColoredDigitsDataModule(tokenizer=tokenizer, limit=60, num_val=10, num_test=10,
                                                            num_val_heldout=10, batch_size=64, colorings=1), "coloured digits)"),
    ]


@pytest.mark.parametrize("which", ["text", "digits", "folder", "shards", "coloured digits"])
def test_datamodules_refuse_an_epoch_without_batches(which: str, tmp_path: Path) -> None:
    name, make, fragment = next(m for m in _zero_batch_modules(tmp_path) if m[0] == which)
    dm = make()
    dm.prepare_data()
    dm.setup("fit")
    with pytest.raises(ValueError, match="an epoch would have no training batch") as info:
        dm.train_dataloader()
    assert fragment in str(info.value) and "batch_size=" in str(info.value)


def test_speech_datamodule_refuses_an_epoch_without_batches(tmp_path: Path, monkeypatch) -> None:
    import diffzoo.data.speech as speech_data

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(speech_data, "SynthConfig", lambda **kw: tiny_synth_config(tuple(kw["clips_per_word"])))
    dm = speech_data.SynthKeywordsDataModule(clips_per_word=[1, 1, 1], silence_clips=[1, 1, 1], batch_size=64)
    dm.prepare_data()
    dm.setup("fit")
    with pytest.raises(ValueError, match=r"the training split \(\d+ clips\) gives \d+ training samples per device"):
        dm.train_dataloader()


def test_a_fit_without_training_batches_exports_nothing(tmp_path: Path) -> None:
    """Any loader (not only diffzoo's DataModules): the run summary refuses to export untrained weights."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from diffzoo.tasks import ImageClassificationTask
    from diffzoo.tasks.callbacks import RunSummary

    task = ImageClassificationTask(model_kwargs=json.loads(TINY_VIT), num_classes=3, in_chans=1)
    data = DataLoader(TensorDataset(torch.randn(3, 1, 28, 28), torch.tensor([0, 1, 2])), batch_size=8, drop_last=True)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, callbacks=[RunSummary()])
    with pytest.raises(ValueError, match="the training data gave 0 batches"):
        trainer.fit(task, train_dataloaders=data)
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("summary.json"))


@pytest.mark.parametrize("content,refused", [(os.urandom(4000), True), (torch.zeros(500).numpy().tobytes(), True),
                                             (b"ordinary text\n" * 300 + b"\xff\xfe" * 10, False)])
def test_binary_corpus_is_refused(content: bytes, refused: bool, tmp_path: Path) -> None:
    from diffzoo.data.text import TextDataModule

    path = tmp_path / "corpus.bin"
    path.write_bytes(content)
    dm = TextDataModule(corpus=str(path), cache_dir=str(tmp_path / "cache"))
    if refused:
        with pytest.raises(ValueError, match=r"corpus\.bin does not look like UTF-8 text: \d+% of its"):
            dm.prepare_data()
    else:
        dm.prepare_data()


# -- divergence: every task stops at the first non-finite loss and exports nothing ---------------
def _poison(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(float("nan"))


def _lm_cli(tmp: Path, args: list[str]):
    from recipes.lm import cli_main

    return cli_main(["fit", "--config", str(lm_config(tmp)), *args], run=False)


def _vit_cli(tmp: Path, args: list[str]):
    from recipes.vit_imagenet import cli_main

    return cli_main(["fit", "--config", str(vit_digits_config(tmp)), *args], run=False)


def _clip_cli(tmp: Path, args: list[str], tiny: str):
    from recipes.clip import cli_main

    from test_clip_recipe import _digits_config

    return cli_main(["fit", "--config", str(_digits_config(tmp / "clip.yaml", tiny)), *args], run=False)


def _speech_cli(tmp: Path, args: list[str]):
    from recipes.speech_commands import cli_main

    from test_speech_recipe import TINY_MODEL as TINY_KWT

    cfg = tmp / "speech.yaml"
    cfg.write_text(f"""
seed_everything: 0
model:
  model: diffkwt_nano
  model_kwargs: {TINY_KWT}
data:
  class_path: diffzoo.data.speech.SynthKeywordsDataModule
  init_args:
    clips_per_word: [3, 1, 1]
    silence_clips: [3, 1, 1]
    batch_size: 36
trainer:
  accelerator: cpu
  log_every_n_steps: 1
  num_sanity_val_steps: 0
  enable_progress_bar: false
  enable_model_summary: false
""")
    return cli_main(["fit", "--config", str(cfg), *args], run=False)


@pytest.mark.parametrize("task", ["lm", "vit", "clip", "speech"])
def test_every_task_stops_on_a_non_finite_loss(task: str, tmp_path: Path, monkeypatch, tiny_clip: str) -> None:
    from diffzoo.tasks.callbacks import TrainingDiverged

    monkeypatch.chdir(tmp_path)
    if task == "speech":
        import diffzoo.data.speech as speech_data

        monkeypatch.setattr(speech_data, "SynthConfig", lambda **kw: tiny_synth_config(tuple(kw["clips_per_word"])))
    args = ["--trainer.max_steps", "3", "--trainer.max_epochs", "1"]
    cli = {"lm": lambda: _lm_cli(tmp_path, args), "vit": lambda: _vit_cli(tmp_path, args),
           "clip": lambda: _clip_cli(tmp_path, args, tiny_clip), "speech": lambda: _speech_cli(tmp_path, args)}[task]()
    _poison(cli.model.model)
    with pytest.raises(TrainingDiverged, match=r"the training loss is nan at step 0 \(epoch 0, batch 0\)"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 0
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("summary.json"))


@pytest.mark.parametrize("task,flag", [("lm", "max_epochs"), ("vit", "max_steps"), ("speech", "max_epochs"),
                                       ("clip", "max_epochs")])
def test_a_zero_training_budget_exports_nothing(task: str, flag: str, tmp_path: Path, monkeypatch,
                                                tiny_clip: str) -> None:
    """max_epochs 0 (or max_steps 0) would end fit at once and export the initial weights: refused."""
    monkeypatch.chdir(tmp_path)
    if task == "speech":
        import diffzoo.data.speech as speech_data

        monkeypatch.setattr(speech_data, "SynthConfig", lambda **kw: tiny_synth_config(tuple(kw["clips_per_word"])))
    args = [f"--trainer.{flag}", "0"]
    cli = {"lm": lambda: _lm_cli(tmp_path, args), "vit": lambda: _vit_cli(tmp_path, args),
           "clip": lambda: _clip_cli(tmp_path, args, tiny_clip), "speech": lambda: _speech_cli(tmp_path, args)}[task]()
    with pytest.raises(ValueError, match=rf"--trainer.{flag} 0 trains nothing, so there are no weights to export"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("summary.json"))


@pytest.mark.parametrize("recipe", ["cluttered_digits", "mqar"])
def test_a_zero_epoch_command_line_ends_in_one_line_and_exports_nothing(recipe: str, tmp_path: Path,
                                                                        monkeypatch) -> None:
    import importlib

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [recipe, "--quick", "--trainer.max_epochs", "0"])
    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"recipes.{recipe}").cli_main()
    assert str(info.value.code) == (f"python -m recipes.{recipe}: error: --trainer.max_epochs 0 trains nothing, so "
                                    "there are no weights to export; give a positive --trainer.max_epochs (or use "
                                    "the validate subcommand to score a model)")
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("summary.json"))


def test_a_fit_that_made_no_optimizer_step_exports_nothing() -> None:
    """The check at the end of fit, for budgets that end before the first step in other ways (max_time)."""
    from types import SimpleNamespace

    from diffzoo.tasks.callbacks import require_trained

    require_trained(SimpleNamespace(num_training_batches=4, global_step=1))
    with pytest.raises(ValueError, match="fit ended after 0 training steps"):
        require_trained(SimpleNamespace(num_training_batches=4, global_step=0))


def test_a_diverging_lm_command_line_ends_in_one_line_and_exit_status_1(tmp_path: Path, monkeypatch) -> None:
    """A learning rate so large that the loss becomes NaN after the first update, given on the command line."""
    from recipes.lm import cli_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lm", "--config", str(lm_config(tmp_path)), "--model.lr", "1e30",
                                      "--trainer.max_steps", "4"])
    with pytest.raises(SystemExit) as info:
        cli_main()
    message = str(info.value.code)  # SystemExit(str) prints it to stderr and exits with status 1
    assert message.startswith("python -m recipes.lm: error: the training loss is nan at step 1 (epoch 0, batch 1)")
    assert "\n" not in message
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("summary.json"))


@pytest.mark.slow
def test_command_line_errors_are_one_line_with_exit_status_1(tmp_path: Path) -> None:
    (tmp_path / "empty.ckpt").write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for args, fragment in ((["--ckpt_path", "empty.ckpt"], "--ckpt_path empty.ckpt is empty (0 bytes), not a checkpoint"),
                           (["--data.seq_len", "0"], "data.seq_len=0 must be a positive integer")):
        run = subprocess.run([sys.executable, "-m", "recipes.lm", *args], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
        assert run.stderr.strip().splitlines()[-1].startswith(f"python -m recipes.lm: error: {fragment}")


# -- NaN predictions are never counted as correct -----------------------------------------------
def test_nan_logits_never_count_as_correct() -> None:
    from diffzoo.evaluation.zeroshot import retrieval_recall, topk_hits
    from diffzoo.tasks import ImageClassificationTask

    task = ImageClassificationTask(model_kwargs=json.loads(TINY_VIT), num_classes=10, in_chans=1)
    labels = torch.arange(10)
    logits = torch.eye(10) * 5  # every row right
    logits[:4] = float("nan")  # four broken rows, one of them labelled 0 (where argmax puts NaN)
    logits[4, 0] = float("inf")
    for metric in (task.val_top1, task.val_top5, task.train_top1):
        metric.reset()
        metric(logits, labels)
        assert metric.compute().item() == pytest.approx(0.5)
    assert topk_hits(logits, labels, (1, 5)) == {1: 5, 5: 5}
    feats = torch.nn.functional.normalize(torch.randn(6, 8), dim=-1)
    broken = feats.clone()
    broken[0] = float("nan")
    assert retrieval_recall(feats, feats, ks=(1,))["i2t_r1"] == 1.0
    out = retrieval_recall(broken, feats, ks=(1,))
    assert out["i2t_r1"] == pytest.approx(5 / 6) and out["t2i_r1"] == 0.0  # a NaN image scores every caption NaN


def test_vit_validation_of_nan_weights_reports_zero_top1(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cli = _vit_cli(tmp_path, [])
    _poison(cli.model.model)
    results = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    assert results[0]["val/top1"] == 0.0 and results[0]["val/top5"] == 0.0


@pytest.mark.parametrize("path", ["http://example.invalid/last.ckpt", "s3://bucket/last.ckpt"])
def test_remote_ckpt_paths_are_refused(path: str, tmp_path: Path, monkeypatch) -> None:
    """Lightning would fetch a URL and unpickle it with weights_only=False."""
    from recipes.lm import cli_main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="is a remote path; diffzoo reads checkpoints only from local files"):
        cli_main(["fit", "--ckpt_path", path])
