"""Train a differential (or softmax) CLIP: ``python -m recipes.clip``.

With no arguments, trains ``DiffCLIP-nano`` on the embedded default (coloured MNIST digits captioned
"a red seven on a blue background", some colour pairs held out of training) in a few minutes on 2 CPU
cores, scoring held-out-pair zero-shot top-1/top-5 and seen-pair retrieval R@1/5/10 on validation digits
every epoch, and saves checkpoints, ``summary.json`` and ``model.safetensors`` (the open_clip state dict)
under ``outputs/clip/version_N/``. After training it scores the test digits (held-out colour pairs, images
used by neither training nor validation) by zero-shot and retrieval and adds ``test/*`` to ``summary.json``;
``--test_after_fit false`` skips that (shard data has no test split of its own and is never scored so).

    python -m recipes.clip                                          # embedded digits (configs/clip_digits.yaml)
    python -m recipes.clip --model.model SoftCLIP-nano --seed_everything 1
    python -m recipes.clip --config recipes/configs/clip_cc3m.yaml --data.train_shards "/data/cc3m/{00000..00331}.tar"
    python -m recipes.clip --ckpt_path outputs/clip/version_0/checkpoints/last.ckpt      # resume
    python -m recipes.clip --model.model ViT-B-32 --model.init_from conv/   # from recipes.convert --from open_clip:ViT-B-32
    python -m recipes.clip --print_config
    python -m recipes.clip validate --config ... --ckpt_path ...

Without a subcommand ``fit`` is run; without ``--config`` the coloured-digits config is used. The built
model's tokenizer, input size and normalisation are handed to the data (``MODEL_INPUTS``).
Score a trained model afterwards with ``python -m recipes.clip_zeroshot``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI

from diffzoo.data.image_text import clip_image_settings
from diffzoo.tasks.contrastive import ClipRunSummary, ContrastiveTask
from recipes._cli import TestAfterFit, add_run_callbacks, launch

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "clip_digits.yaml"


# What the image-text DataModules take from the built model: its tokenizer, input size and normalisation.
MODEL_INPUTS: dict[str, Callable[[ContrastiveTask], Any]] = {
    "tokenizer": lambda task: task.tokenizer,
    "image_size": lambda task: clip_image_settings(task.model)[0],
    "mean": lambda task: clip_image_settings(task.model)[1],
    "std": lambda task: clip_image_settings(task.model)[2],
}


class ClipCLI(TestAfterFit, LightningCLI):
    """LightningCLI handing the model's input settings to the data, with checkpoint / summary callbacks always on
    and a final test when the data has a test split of its own (the coloured digits)."""

    def add_arguments_to_parser(self, parser) -> None:
        for name, read in MODEL_INPUTS.items():
            parser.link_arguments("model", f"data.init_args.{name}", compute_fn=read, apply_on="instantiate")
        add_run_callbacks(parser, ClipRunSummary, monitor="val/zs_top1", mode="max")
        self.add_test_after_fit(parser)


def cli_main(args: list[str] | None = None, run: bool = True) -> ClipCLI:
    """Run the recipe; ``args`` as on the command line (default ``sys.argv[1:]``)."""
    return launch(
        ClipCLI, ContrastiveTask, pl.LightningDataModule, subclass_mode_data=True,
        name="clip", default_config=DEFAULT_CONFIG, args=args, run=run,
    )


if __name__ == "__main__":
    cli_main()
