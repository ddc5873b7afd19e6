"""diffzoo: differential attention for any transformer (Ye et al., ICLR 2025, arXiv 2410.05258)."""

__version__ = "0.1.0"

import warnings

from . import kernels, layers  # noqa: F401  (layers and kernels import only torch)

# the host libraries the model families build on (module -> what to install); layers and kernels need neither
_HOSTS = {"timm": "timm", "open_clip": "open_clip_torch"}

try:  # the model families register themselves with timm and open_clip
    from . import models  # noqa: F401
except ModuleNotFoundError as err:
    missing = (err.name or "").split(".")[0]
    if missing not in _HOSTS:
        raise
    warnings.warn(
        f"diffzoo.models (the ViT, CLIP, speech and LM families) was not imported: {missing} is not installed "
        f"(pip install {_HOSTS[missing]}); diffzoo.layers and diffzoo.kernels work without it",
        stacklevel=2,
    )
