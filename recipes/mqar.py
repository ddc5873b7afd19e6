"""Multi-query associative recall with distractors: ``python -m recipes.mqar``.

With no arguments, trains a 2-block width-64 causal LM with differential attention on MQAR sequences
generated on the fly (``configs/mqar.yaml``: 4 key-value pairs, 4 queries, no filler, 1000 steps of batch
256), reports the exact-value accuracy on the query positions of a fixed validation set (``val/acc``, used to pick
settings) and of a fixed test set (``test/acc``); chance is ``1 / value_vocab`` (1/64).

    python -m recipes.mqar                                        # configs/mqar.yaml
    python -m recipes.mqar --model.attn softmax                   # any variant: softmax, softmax_wide, diff,
                                                                  # diff_nonorm, diff_const, diff_v2, diff_v2_matched
    python -m recipes.mqar --data.num_pairs 32 --data.filler 128  # more pairs, key-alphabet filler between
    python -m recipes.mqar --data.seq_len 256                     # filler = 256 - 2 pairs - 2 queries
    python -m recipes.mqar --quick                                # a few steps (smoke test)

The noise knobs are swept per variant by ``python -m recipes.sweep --family mqar --knob ...``.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from diffzoo.data.mqar import MQARDataModule
from diffzoo.tasks.monitor import GradNormMonitor
from diffzoo.tasks.mqar import MQARRunSummary, MQARTask
from recipes._cli import add_run_callbacks, launch

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "mqar.yaml"
QUICK = ["--trainer.max_epochs", "1", "--data.steps_per_epoch", "4", "--data.num_val", "64",
         "--data.num_test", "64", "--model.warmup_steps", "2", "--trainer.log_every_n_steps", "1",
         "--monitor.every_n_steps", "1"]


class MQARCLI(LightningCLI):
    """LightningCLI with the vocabulary linked to the model and summary/gradient-norm callbacks always on."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        add_run_callbacks(parser, MQARRunSummary, monitor="val/acc", mode="max", keep_checkpoints=False)
        parser.add_lightning_class_args(GradNormMonitor, "monitor")


def cli_main(args: list[str] | None = None, run: bool = True) -> MQARCLI:
    """Run the recipe; ``args`` as on the command line (default ``sys.argv[1:]``); ``--quick`` for a smoke run."""
    return launch(MQARCLI, MQARTask, MQARDataModule, name="mqar", default_config=DEFAULT_CONFIG,
                  args=args, run=run, quick=QUICK)


if __name__ == "__main__":
    cli_main()
