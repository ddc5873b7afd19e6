"""Train a differential (or softmax) causal language model: ``python -m recipes.lm``.

With no arguments, trains ``lm_tiny`` (differential attention, byte tokens) on the embedded corpus (the
help topics of Python's ``pydoc_data``, ~750 KB of English) in a few minutes on 2 CPU cores, prints the
validation loss and perplexity, and saves checkpoints and ``model.safetensors`` under
``outputs/lm/version_N/``.

    python -m recipes.lm                                             # configs/lm_pydoc.yaml
    python -m recipes.lm --model.attn softmax --seed_everything 1    # the matched softmax baseline
    python -m recipes.lm --model.model lm_nano                       # a larger preset
    python -m recipes.lm --data.test_windows 64                      # held-out test windows, scored after fit
    python -m recipes.lm --data.corpus my_texts/ --data.tokenizer tokenizer.json
    python -m recipes.lm --trainer.accumulate_grad_batches 4         # gradient accumulation
    python -m recipes.lm --ckpt_path outputs/lm/version_0/checkpoints/last.ckpt   # resume
    python -m recipes.lm --print_config
    python -m recipes.lm validate --config recipes/configs/lm_pydoc.yaml --ckpt_path ...

Retrieval evaluation of a trained model: ``python -m recipes.lm_retrieval --weights .../model.safetensors``.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from diffzoo.data.text import TextDataModule
from diffzoo.tasks.lm import LanguageModelTask, LMRunSummary
from recipes._cli import TestAfterFit, add_run_callbacks, launch

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "lm_pydoc.yaml"


class LMCLI(TestAfterFit, LightningCLI):
    """LightningCLI with the tokenizer's vocabulary linked to the model, checkpoints/summary always on, and a
    final test when the data has a test split of its own (``--data.test_windows N``)."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        add_run_callbacks(parser, LMRunSummary, monitor="val/loss", mode="min")
        self.add_test_after_fit(parser)


def cli_main(args: list[str] | None = None, run: bool = True) -> LMCLI:
    """Run the recipe; ``args`` as on the command line (default ``sys.argv[1:]``)."""
    return launch(LMCLI, LanguageModelTask, TextDataModule, name="lm", default_config=DEFAULT_CONFIG, args=args, run=run)

if __name__ == "__main__":
    cli_main()
