"""Reading checkpoint and weight files without running code from them.

``torch.load(weights_only=False)`` unpickles arbitrary objects, and unpickling can call any function the
file names, so a crafted checkpoint runs code on the machine that opens it. Every file diffzoo reads on a
user's behalf goes through this module instead:

* ``.safetensors`` files are read with safetensors (a JSON header and raw tensors; nothing is executed);
* anything else is read with ``torch.load(weights_only=True)``, which rebuilds only tensors, containers
  and plain values (plus the harmless types in :data:`SAFE_GLOBALS`), and refuses every other object
  with a one-line :class:`UnsafeCheckpointError` that names the objects it found.

Empty, truncated and non-checkpoint files are refused with a :class:`CheckpointReadError` that says what
the file is not, instead of a bare ``EOFError`` or ``UnpicklingError``.

:func:`read_state_dict` reads the model's state dict out of any training checkpoint (a Lightning ``.ckpt``,
an open_clip / DDP / ``torch.compile`` checkpoint or a plain state dict): :func:`unwrap_state_dict` is the
one place that knows those wrappers.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

PathLike = str | os.PathLike

__all__ = ["CheckpointReadError", "SAFE_GLOBALS", "UnsafeCheckpointError", "check_checkpoint_file", "is_lightning_checkpoint",
           "load_torch_file", "read_state_dict", "compare_state", "read_weights", "submodule_state", "unwrap_state_dict"]

# Types whose reconstruction runs no code of the file's choosing: argparse.Namespace (the training
# arguments some published checkpoints carry) only receives attribute values, which are themselves
# restricted to tensors and plain values.
SAFE_GLOBALS: tuple[type, ...] = (argparse.Namespace,)

_RESAVE = ("Re-save it as a plain state dict (torch.save(model.state_dict(), path)) or as safetensors "
           "(safetensors.torch.save_file)")


class CheckpointReadError(ValueError):
    """A file that is not a checkpoint diffzoo can read (empty, truncated, not a PyTorch/safetensors file)."""


class UnsafeCheckpointError(CheckpointReadError):
    """A checkpoint that holds pickled objects other than tensors and plain values."""


def _label(path: Path, what: str) -> str:
    return f"{what} {path}" if what else str(path)


def _unsafe_globals(path: Path, message: str) -> list[str]:
    """The pickled objects ``torch.load(weights_only=True)`` refused in ``path`` (best effort)."""
    if zipfile.is_zipfile(path):
        try:
            allowed = {f"{t.__module__}.{t.__qualname__}" for t in SAFE_GLOBALS}
            return [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) if g not in allowed]
        except Exception:  # noqa: BLE001 - fall back to the loader's message
            pass
    found = re.findall(r"GLOBAL (\S+) was not an allowed global", message)
    return [name if "." in name else f"builtins.{name}" for name in found]


def _check_file(path: Path, what: str) -> None:
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]+:/", str(path)):  # Path() folds "http://" to "http:/"
        raise CheckpointReadError(f"{what or 'checkpoint'} {str(path).replace(':/', '://', 1)} is a remote path; "
                                  "diffzoo reads checkpoints only from local files (download it first)")
    if not path.exists():
        raise FileNotFoundError(f"{_label(path, what)} does not exist")
    if not path.is_file():
        raise CheckpointReadError(f"{_label(path, what)} is not a file")
    if path.stat().st_size == 0:
        raise CheckpointReadError(f"{_label(path, what)} is empty (0 bytes), not a checkpoint; was its copy or save "
                                  "interrupted?")


def load_torch_file(path: PathLike, map_location: Any = "cpu", what: str = "", mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` with one-line errors.

    Args:
        path: a file written by ``torch.save`` (Lightning ``.ckpt``, ``.pt``, ``.pth``, ...).
        map_location: where tensors go.
        what: how the error messages name the file (e.g. ``"--ckpt_path"``).
        mmap: memory-map the tensors instead of reading them (zip-format files only).

    Raises:
        FileNotFoundError: no such file.
        CheckpointReadError: a remote path (``http://``, ``s3://``, ...): download the file first.
        UnsafeCheckpointError: the file holds pickled objects other than tensors and plain values.
        CheckpointReadError: the file is empty, truncated or not a ``torch.save`` file.
    """
    path = Path(path)
    _check_file(path, what)
    label = _label(path, what)
    mmap = mmap and zipfile.is_zipfile(path)
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")  # refused below if it matters
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        found = _unsafe_globals(path, str(e))
        if found:
            raise UnsafeCheckpointError(
                f"{label} holds pickled objects ({', '.join(sorted(set(found)))}); diffzoo loads only tensors and "
                f"plain values, because unpickling other objects can run code from the file. {_RESAVE}"
            ) from None
        raise CheckpointReadError(f"{label} is not a PyTorch checkpoint diffzoo can read safely "
                                  "(not a torch.save file, or one holding more than tensors and plain values)") from None
    except (EOFError, RuntimeError, OSError, ValueError, zipfile.BadZipFile) as e:
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise CheckpointReadError(f"{label} is not a readable PyTorch checkpoint (truncated or another kind of "
                                  f"file: {reason})") from None


def _looks_like_safetensors(path: Path) -> bool:
    """A safetensors file starts with the 8-byte length of its JSON header, then ``{``."""
    with open(path, "rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < path.stat().st_size


def read_weights(path: PathLike, what: str = "", map_location: Any = "cpu") -> Any:
    """The content of a weight file: ``.safetensors`` through safetensors, anything else through
    :func:`load_torch_file` (tensors and plain values only)."""
    path = Path(path)
    _check_file(path, what)
    if path.suffix != ".safetensors" and not _looks_like_safetensors(path):
        return load_torch_file(path, map_location=map_location, what=what)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=str(map_location))
    except SafetensorError as e:
        raise CheckpointReadError(f"{_label(path, what)} is not a valid safetensors file ({e})") from None


def check_checkpoint_file(path: PathLike, what: str = "checkpoint") -> None:
    """Refuse ``path`` (one-line error) unless it is a local checkpoint readable with ``weights_only=True``.

    The tensors are memory-mapped rather than read, so this costs little even for large checkpoints.
    Remote paths (``http://``, ``s3://``, ...) are refused: download the file first.
    """
    load_torch_file(path, what=what, mmap=True)


_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel, torch.compile


def unwrap_state_dict(checkpoint: Mapping[str, Any]) -> dict[str, Tensor]:
    """The model state_dict inside a training checkpoint.

    Follows ``"state_dict"`` / ``"model"`` / ``"module"`` entries that hold dicts and strips the prefixes
    ``module.`` (DistributedDataParallel) and ``_orig_mod.`` (``torch.compile``) when every key has them.
    """
    sd: Any = checkpoint
    while isinstance(sd, Mapping):
        inner = next((sd[k] for k in ("state_dict", "model", "module") if isinstance(sd.get(k), Mapping)), None)
        if inner is None:
            break
        sd = inner
    if not isinstance(sd, Mapping) or not sd:
        raise ValueError(
            "the checkpoint holds no state_dict (expected a dict of tensors, or one under 'state_dict'/'model')"
        )
    sd = dict(sd)
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in sd):
                sd = {k[len(prefix):]: v for k, v in sd.items()}
                stripped = True
    not_tensors = sorted(k for k, v in sd.items() if not isinstance(v, Tensor))
    if not_tensors:
        raise ValueError(f"the state_dict has entries that are not tensors: {not_tensors[:10]}")
    return sd


def submodule_state(state_dict: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of ``state_dict`` under ``prefix`` (e.g. ``"model."``), with the prefix removed."""
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def compare_state(model: nn.Module, state: Mapping[str, Tensor]) -> tuple[list[str], list[str], list[str]]:
    """How ``state`` fits ``model``: ``(missing, unexpected, mismatched)`` keys, the model's keys absent from
    ``state`` (in the model's order), the keys of ``state`` the model lacks and those whose shapes differ
    (both in ``state``'s order). Check before ``load_state_dict``: torch raises a multi-line error on a shape
    mismatch even with ``strict=False``."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = [k for k in shapes if k not in state]
    unexpected = [k for k in state if k not in shapes]
    mismatched = [k for k, v in state.items() if k in shapes and tuple(v.shape) != shapes[k]]
    return missing, unexpected, mismatched


def is_lightning_checkpoint(content: Any) -> bool:
    """Whether ``content`` (a read file) is a Lightning checkpoint (``state_dict`` and a Lightning version)."""
    return (isinstance(content, dict) and "pytorch-lightning_version" in content
            and isinstance(content.get("state_dict"), dict))


def read_state_dict(path: PathLike, what: str = "checkpoint", prefix: str = "model.") -> dict[str, Tensor]:
    """The model weights in ``path``: a diffzoo Lightning checkpoint (the entries under ``prefix``, the task's
    model), an open_clip / DDP / ``torch.compile`` training checkpoint, a plain state dict or a safetensors file.

    Raises:
        ValueError: one line naming the file when it holds no state dict of tensors (besides the errors of
            :func:`read_weights`).
    """
    content = read_weights(path, what=what)
    if is_lightning_checkpoint(content):
        content = submodule_state(content["state_dict"], prefix)
    try:
        return unwrap_state_dict(content)  # open_clip / DDP / torch.compile wrappers
    except ValueError as e:
        raise ValueError(f"{_label(Path(path), what)} holds no model weights: {e}") from None
