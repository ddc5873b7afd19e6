"""Train a differential (or softmax) keyword-spotting transformer: ``python -m recipes.speech_commands``.

With no arguments, trains ``diffkwt_nano`` on the embedded default (Speech Commands words spoken by
espeak-ng voices, noise mixed in, voice-disjoint splits; synthesised and cached under
``data/cache/speech_synth/`` on first use) in a few minutes on 2 CPU cores, then scores the test voices,
and saves checkpoints, ``summary.json`` and ``model.safetensors`` under ``outputs/speech_commands/version_N/``.

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

import json
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI

from diffzoo.tasks.callbacks import RunSummary
from diffzoo.tasks.speech import SpeechClassificationTask
from recipes._cli import add_run_callbacks, launch

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "speech_synth.yaml"


class SpeechCLI(LightningCLI):
    """LightningCLI linking the class count to the model, with checkpoints, a run summary and a final test."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        add_run_callbacks(parser, RunSummary, monitor="val/top1", mode="max")
        parser.add_argument("--test_after_fit", type=bool, default=True,
                            help="score the test split with the final weights after fit (added to summary.json)")

    def after_fit(self) -> None:
        if not self.config["fit"].get("test_after_fit", True) or self.trainer.interrupted or self.trainer.fast_dev_run:
            return
        if type(self.datamodule).test_dataloader is pl.LightningDataModule.test_dataloader:
            return  # the data has no test split
        results = self.trainer.test(self.model, datamodule=self.datamodule, verbose=False)
        if self.trainer.is_global_zero and results:
            path = Path(self.trainer.log_dir) / "summary.json"
            summary = json.loads(path.read_text()) if path.is_file() else {}
            summary.setdefault("metrics", {}).update({k: float(v) for k, v in results[0].items()})
            path.write_text(json.dumps(summary, indent=2))
            print(f"test/top1: {100 * results[0].get('test/top1', float('nan')):.2f} %", flush=True)


def cli_main(args: list[str] | None = None, run: bool = True) -> SpeechCLI:
    """Run the recipe; ``args`` as on the command line (default ``sys.argv[1:]``)."""
    return launch(
        SpeechCLI, SpeechClassificationTask, pl.LightningDataModule, subclass_mode_data=True,
        name="speech_commands", default_config=DEFAULT_CONFIG, args=args, run=run,
    )

if __name__ == "__main__":
    cli_main()
