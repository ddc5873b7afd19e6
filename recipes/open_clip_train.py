"""Train diffzoo's CLIP models with open_clip's own training script (``open_clip_train.main``).

open_clip's trainer knows a model only by the name of a registered config. diffzoo registers its
configs (``DiffCLIP-*``, ``DiffCLIPstar-*``, ``DiffCLIPdagger-*``, ``SoftCLIP-*``) and the tower
builders they need when it is imported, so this entry point imports diffzoo and then hands the whole
command line, unchanged, to open_clip's trainer. Every flag, the logging, resuming and the distributed
launch are open_clip's::

    python -m recipes.open_clip_train --model DiffCLIP-nano --train-data 'shards/train-{000000..000009}.tar' \\
        --dataset-type webdataset --train-num-samples 10000 --batch-size 64 --epochs 2 --precision fp32

    torchrun --nproc_per_node 4 -m recipes.open_clip_train --model DiffCLIP-ViT-B-16 ...

It needs open_clip's training extra (``pip install "diffzoo[openclip-train]"``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Run open_clip's trainer with diffzoo's model configs registered (``argv`` defaults to sys.argv)."""
    import diffzoo  # noqa: F401  (registers the DiffCLIP/SoftCLIP configs and tower builders with open_clip)

    try:
        from open_clip_train.main import main as open_clip_main
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise SystemExit(
            f"open_clip's training script cannot be imported ({err}); "
            'install it with: pip install "diffzoo[openclip-train]"'
        ) from err
    open_clip_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
