"""Exact resume: checkpoints that carry the random-number states, so a resumed run continues as if it
had never stopped (same augmentations, same dropout masks, same data order)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


class RestoresRNG:
    """LightningModule mixin: ``on_save_checkpoint`` stores the torch, numpy and Python RNG states and
    ``on_load_checkpoint`` restores them. List it before ``LightningModule`` in the bases."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Plain tensors and tuples only, so Lightning's weights_only checkpoint loading accepts them.
        name, keys, pos, has_gauss, cached = np.random.get_state()
        checkpoint["rng_states"] = {
            "torch": torch.get_rng_state(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
            "python": random.getstate(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("rng_states")
        if states:
            torch.set_rng_state(states["torch"])
            name, keys, pos, has_gauss, cached = states["numpy"]
            np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
            random.setstate(states["python"])
