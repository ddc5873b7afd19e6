"""diffzoo.weights: every way weights enter or leave a model, one reader per format.

* :mod:`~diffzoo.weights.io`: reading any file safely (safetensors, or ``torch.load(weights_only=True)``)
  and the model's state dict out of a training checkpoint (Lightning, open_clip, DDP, ``torch.compile``);
* :mod:`~diffzoo.weights.export`: diffzoo's own exports (safetensors whose header names the model and its
  arguments): write them, read their metadata, rebuild the model (:func:`load_exported`, :func:`load_lm`);
* :mod:`~diffzoo.weights.clip`: open_clip models by name with a checkpoint (:func:`load_clip`);
* :mod:`~diffzoo.weights.convert`: softmax to differential attention, and the converted-model folder
  (``model.safetensors`` + ``convert.json``: :func:`save_converted`, :func:`read_converted`,
  :func:`load_converted`, :func:`load_init_from`);
* :mod:`~diffzoo.weights.diffclip`: checkpoints in the published DiffCLIP layout;
* :mod:`~diffzoo.weights.hf_difflama`: transformers' ``DiffLlamaForCausalLM`` to and from diffzoo's LM.

Importing this package imports torch and diffzoo's models (hence timm and open_clip), never Lightning;
transformers is imported only inside the functions that need it.
"""

from .clip import check_model_name, checkpoint_model_name, load_clip, load_clip_weights
from .convert import converted_lambda_init, load_converted, load_init_from, read_converted, save_converted
from .diffclip import convert_diffclip_state_dict, load_diffclip_checkpoint
from .export import (
    export_checkpoint,
    export_lm,
    export_module,
    load_exported,
    load_lm,
    load_tied,
    read_metadata,
    safetensors_metadata,
    save_safetensors,
)
from .hf_difflama import from_hf_difflama, to_hf_difflama
from .io import (
    CheckpointReadError,
    UnsafeCheckpointError,
    check_checkpoint_file,
    load_torch_file,
    read_state_dict,
    read_weights,
    unwrap_state_dict,
)

__all__ = [
    "CheckpointReadError",
    "UnsafeCheckpointError",
    "check_checkpoint_file",
    "check_model_name",
    "checkpoint_model_name",
    "convert_diffclip_state_dict",
    "converted_lambda_init",
    "export_checkpoint",
    "export_lm",
    "export_module",
    "from_hf_difflama",
    "load_clip",
    "load_clip_weights",
    "load_converted",
    "load_diffclip_checkpoint",
    "load_exported",
    "load_init_from",
    "load_lm",
    "load_tied",
    "load_torch_file",
    "read_converted",
    "read_metadata",
    "read_state_dict",
    "read_weights",
    "safetensors_metadata",
    "save_converted",
    "save_safetensors",
    "to_hf_difflama",
    "unwrap_state_dict",
]
