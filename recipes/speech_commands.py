"""Train a differential (or softmax) keyword-spotting transformer: ``python -m recipes.speech_commands``.

With no arguments, trains ``diffkwt_nano`` on the embedded default (Speech Commands words spoken by
espeak-ng voices, noise mixed in, voice-disjoint splits; synthesised and cached under
``data/cache/speech_synth/`` on first use) in a few minutes on 2 CPU cores, then scores the test voices,
and saves checkpoints, ``summary.json``, ``model.safetensors`` and ``test_clips.csv`` (every test clip's
prediction with its voice and SNR) under ``outputs/speech_commands/version_N/``.

    python -m recipes.speech_commands                                     # configs/speech_synth.yaml
    python -m recipes.speech_commands --model.model softkwt_nano --seed_everything 1
    python -m recipes.speech_commands --config recipes/configs/speech_commands_v2.yaml --data.data_dir /data/sc
    python -m recipes.speech_commands --config ... --data.num_classes 35 --model.model diffkwt_2
    python -m recipes.speech_commands test --config ... --ckpt_path outputs/.../checkpoints/last.ckpt
    python -m recipes.speech_commands --print_config

Without a subcommand ``fit`` is run; without ``--config`` the synthesised-keywords config is used.
``--test_after_fit false`` skips the test-split evaluation that otherwise follows training.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI

from diffzoo.tasks.callbacks import RunSummary, TestClipsCSV
from diffzoo.tasks.speech import SpeechClassificationTask
from recipes._cli import TestAfterFit, add_run_callbacks, launch

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "speech_synth.yaml"


class SpeechCLI(TestAfterFit, LightningCLI):
    """LightningCLI linking the class count to the model, with checkpoints, a run summary and a final test."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        add_run_callbacks(parser, RunSummary, monitor="val/top1", mode="max")
        parser.add_lightning_class_args(TestClipsCSV, "test_clips")  # every scored test clip, voice and SNR
        self.add_test_after_fit(parser)


def cli_main(args: list[str] | None = None, run: bool = True) -> SpeechCLI:
    """Run the recipe; ``args`` as on the command line (default ``sys.argv[1:]``)."""
    return launch(
        SpeechCLI, SpeechClassificationTask, pl.LightningDataModule, subclass_mode_data=True,
        name="speech_commands", default_config=DEFAULT_CONFIG, args=args, run=run,
    )

if __name__ == "__main__":
    cli_main()
