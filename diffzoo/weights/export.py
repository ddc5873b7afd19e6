"""Export trained models as safetensors and reload them: classifiers through timm, language models as
:class:`~diffzoo.models.lm.CausalLM`.

The safetensors header carries the model name and the constructor arguments, so::

    from diffzoo.weights import load_exported
    model = load_exported("outputs/vit_imagenet/version_0/model.safetensors")

is the same as::

    import diffzoo, timm
    model = timm.create_model("diffvit_nano_patch7_28", pretrained=True, num_classes=10, in_chans=1,
                              pretrained_cfg_overlay=dict(file="outputs/.../model.safetensors", num_classes=10))

(``num_classes`` belongs in the overlay too: timm discards a saved classifier whose size differs from
the pretrained config's.) :func:`load_lm` rebuilds a language model exported by :func:`export_lm`.

The exporters take a trained task (any module with ``model`` and ``hparams``; a LightningModule is one)
and import nothing of Lightning.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ..models.lm import LM_PRESETS, LM_RENAMED, CausalLM, LMConfig, preset_args
from .io import load_torch_file, read_weights, submodule_state

__all__ = ["export_checkpoint", "export_lm", "export_module", "load_exported", "load_lm", "load_tied", "read_metadata",
           "safetensors_metadata", "save_safetensors"]

PathLike = str | os.PathLike


def _model_args(hparams: dict[str, Any]) -> dict[str, Any]:
    args = dict(hparams.get("model_kwargs") or {})
    if hparams.get("attn") is not None:  # the task's --model.attn (the attention spec's name)
        args["attn"] = hparams["attn"]
    for key in ("num_classes", "in_chans", "img_size"):
        if hparams.get(key) is not None:
            args.setdefault(key, hparams[key])
    return args


def save_safetensors(
    state_dict: dict[str, Tensor], path: PathLike, model_name: str, model_args: dict[str, Any]
) -> Path:
    """Write ``state_dict`` to ``path`` with the model name and arguments in the header metadata."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    save_file(tensors, str(path), metadata={"model": model_name, "model_args": json.dumps(model_args)})
    return path


def load_tied(module: nn.Module, state: dict[str, Tensor]) -> tuple[list[str], list[str]]:
    """Load ``state`` into ``module`` where the names match; return ``(missing, unexpected)`` keys, leaving out
    of ``missing`` a tied parameter stored once under its twin's name (an LM's output weight saved as the
    token embedding)."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    params = dict(module.named_parameters(remove_duplicate=False))
    missing = [k for k in missing if not (k in params and any(params.get(j) is params[k] for j in state))]
    return missing, list(unexpected)


def export_module(
    task: nn.Module, path: PathLike, use_ema: bool = False, state_dict: dict[str, Tensor] | None = None
) -> Path:
    """Export the classifier of an :class:`ImageClassificationTask` (or its EMA copy) to safetensors.

    ``state_dict``: the task's full state dict when the task's own parameters are sharded (FSDP), as
    gathered by ``trainer.strategy.lightning_module_state_dict()``; by default the task's ``state_dict()``.
    """
    if state_dict is not None:
        weights = submodule_state(state_dict, "ema.module." if use_ema else "model.")
    else:
        model = task.ema.module if use_ema and getattr(task, "ema", None) is not None else task.model
        weights = model.state_dict()
    return save_safetensors(weights, path, task.hparams["model"], _model_args(dict(task.hparams)))


def export_checkpoint(checkpoint: PathLike, path: PathLike | None = None, use_ema: bool = False) -> Path:
    """Convert a Lightning checkpoint of :class:`ImageClassificationTask` to ``path`` (default: next to it).

    Args:
        checkpoint: ``.ckpt`` written by the recipe.
        path: output ``.safetensors`` path.
        use_ema: export the EMA weights (the checkpoint must hold them).
    """
    checkpoint = Path(checkpoint)
    ckpt = load_torch_file(checkpoint, what="checkpoint")  # tensors and plain values only
    hparams = dict(ckpt.get("hyper_parameters") or {}) if isinstance(ckpt, dict) else {}
    if "model" not in hparams or not isinstance(ckpt.get("state_dict"), dict):
        raise ValueError(f"{checkpoint} was not written by diffzoo.tasks.ImageClassificationTask (no 'model' hparam)")
    prefix = "ema.module." if use_ema else "model."
    state = submodule_state(ckpt["state_dict"], prefix)
    if not state:
        raise ValueError(f"{checkpoint} holds no weights under {prefix!r}" + (" (trained without EMA?)" if use_ema else ""))
    path = Path(path) if path is not None else checkpoint.with_suffix(".safetensors")
    return save_safetensors(state, path, hparams["model"], _model_args(hparams))


def read_metadata(path: PathLike) -> tuple[str, dict[str, Any]]:
    """``(model_name, model_args)`` stored in an exported safetensors file."""
    meta = safetensors_metadata(path)
    if "model" not in meta:
        raise ValueError(f"{path} has no diffzoo metadata; pass the model name to timm.create_model yourself")
    try:
        args = json.loads(meta.get("model_args", "{}"))
    except json.JSONDecodeError:
        args = None
    if not isinstance(args, dict):
        raise ValueError(f"{path}: the model_args metadata is not a JSON object; the file was not written by diffzoo")
    return meta["model"], args


def safetensors_metadata(path: PathLike) -> dict[str, str]:
    """The header metadata of a safetensors file (``{}`` when it has none); one-line errors for other files."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except SafetensorError as e:
        raise ValueError(f"{path} is not a safetensors file ({e}); diffzoo exports weights as .safetensors") from None


def _read_former_variant(args: dict[str, Any]) -> None:
    """Exports of earlier versions stored a study variant as ``variant`` beside arguments that already held
    its head count and feed-forward width; the variant's other settings (lambda rule, sub-norm) become
    ``attn``."""
    from ..layers.spec import get_spec

    variant = args.pop("variant", None)
    if variant is not None:
        spec = get_spec(variant)
        if spec.head_scale == 1.0 and not spec.match_params:
            args["attn"] = spec.name


LM_EXPORT_NAMES = (*LM_PRESETS, "mqar_lm")  # the model names export_lm and the MQAR task write; load_lm reads them


def load_exported(path: PathLike, **overrides: Any) -> nn.Module:
    """Rebuild an exported model with ``timm.create_model(..., pretrained_cfg_overlay=dict(file=path))``.

    ``overrides`` replace stored arguments (e.g. ``num_classes=0`` for a feature extractor).
    """
    import timm

    from .. import models  # noqa: F401  (registers diffvit_* / softvit_* / the speech models with timm)

    name, args = read_metadata(path)
    if name in LM_EXPORT_NAMES:  # timm's registry does not hold the language models
        raise ValueError(f"{path} holds the language model {name!r}: load it with diffzoo.weights.load_lm({str(path)!r})")
    _read_former_variant(args)
    stored_classes = args.get("num_classes")
    args.update(overrides)
    # timm keeps the saved classifier only when the cfg's num_classes equals the model's.
    overlay = dict(file=str(path))
    if stored_classes is not None:
        overlay["num_classes"] = stored_classes
    return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **args)


def export_lm(task: nn.Module, path: Any, state_dict: dict[str, Tensor] | None = None) -> Path:
    """Write the model's weights to safetensors (a tied output weight is stored once, as the embedding).

    ``task``: a :class:`~diffzoo.tasks.lm.LanguageModelTask` (its ``model``, ``config`` and ``hparams``).
    ``state_dict``: the task's full state dict when its parameters are sharded (see :func:`export_module`).
    """
    sd = submodule_state(state_dict, "model.") if state_dict is not None else task.model.state_dict()
    if task.config.tie_embeddings:
        sd.pop("output.weight")
    args = preset_args(task.hparams["model"], **(task.hparams.get("model_kwargs") or {}))
    args.update(attn=task.hparams["attn"], vocab_size=task.hparams["vocab_size"])
    return save_safetensors(sd, path, task.hparams["model"], args)


def load_lm(path: Any) -> CausalLM:
    """Rebuild a :class:`CausalLM` from a file written by :func:`export_lm` (or by the MQAR task's export).

    Raises ``ValueError`` (one line) for a file that is not such an export: not safetensors, no diffzoo
    metadata, or the weights of another model family (e.g. a ViT export).
    """
    meta = safetensors_metadata(path)
    if "model" not in meta or "model_args" not in meta:
        raise ValueError(f"{path} has no diffzoo metadata (model, model_args); load_lm reads the model.safetensors "
                         "that python -m recipes.lm (export_lm) writes")
    name, args = read_metadata(path)
    fields = {f.name for f in dataclasses.fields(LMConfig)} | set(LM_RENAMED)  # older exports use the former names
    if name not in LM_EXPORT_NAMES or not set(args) <= fields:
        raise ValueError(
            f"{path} holds a {name!r} model, not a diffzoo language model; pass a model.safetensors written by "
            f"python -m recipes.lm (presets: {', '.join(sorted(LM_PRESETS))})"
        )
    model = CausalLM(LMConfig(**args))
    model.load_state_dict(read_weights(path), strict=not model.config.tie_embeddings)
    return model
