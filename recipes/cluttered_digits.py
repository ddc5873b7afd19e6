"""Cluttered digits: ``python -m recipes.cluttered_digits``.

With no arguments, trains a differential nano ViT (``diffvit_nano_patch7_28`` at 42x42 with 7x7 patches,
36 patches) to name the whole MNIST digit on a 42x42 canvas among ``k = 4`` 14x14 fragments of other digits,
everything on the patch grid (``configs/cluttered_digits.yaml``; data from :mod:`diffzoo.data.cluttered`, no
download). Reports top-1
on fixed validation (``val/top1``, used to pick settings) and test (``test/top1``) images; chance is 10 %.

    python -m recipes.cluttered_digits                                # configs/cluttered_digits.yaml
    python -m recipes.cluttered_digits --model.attn softmax           # any variant: softmax, softmax_wide, diff,
                                                                      # diff_nonorm, diff_const, diff_v2, diff_v2_matched
    python -m recipes.cluttered_digits --data.k 12                    # more distractor fragments
    python -m recipes.cluttered_digits --data.canvas 84               # 144 patches
    python -m recipes.cluttered_digits --quick                        # a few steps (smoke test)

The knob is swept per variant by ``python -m recipes.sweep --family cluttered --knob data.k ...``.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from diffzoo.data.cluttered import ClutteredDigitsDataModule
from diffzoo.tasks.cluttered import VariantImageTask, VariantRunSummary
from diffzoo.tasks.monitor import GradNormMonitor
from recipes._cli import add_run_callbacks, launch

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "cluttered_digits.yaml"
QUICK = ["--trainer.max_epochs", "1", "--data.limit_train", "128", "--data.num_val", "64", "--data.num_test", "64",
         "--trainer.log_every_n_steps", "1", "--monitor.every_n_steps", "1"]


class ClutteredCLI(LightningCLI):
    """LightningCLI with the data's shape linked to the model and summary/gradient-norm callbacks always on."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.in_chans", "model.in_chans", apply_on="instantiate")
        parser.link_arguments("data.img_size", "model.img_size", apply_on="instantiate")
        add_run_callbacks(parser, VariantRunSummary, monitor="val/top1", mode="max", keep_checkpoints=False)
        parser.add_lightning_class_args(GradNormMonitor, "monitor")


def cli_main(args: list[str] | None = None, run: bool = True) -> ClutteredCLI:
    """Run the recipe; ``args`` as on the command line (default ``sys.argv[1:]``); ``--quick`` for a smoke run."""
    return launch(ClutteredCLI, VariantImageTask, ClutteredDigitsDataModule, name="cluttered_digits",
                  default_config=DEFAULT_CONFIG, args=args, run=run, quick=QUICK)


if __name__ == "__main__":
    cli_main()
