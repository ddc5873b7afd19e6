"""diffzoo: differential attention for any transformer (Ye et al., ICLR 2025, arXiv 2410.05258)."""

__version__ = "0.1.0"

from . import kernels, layers  # noqa: F401  (layers and kernels import only torch)

try:  # the model families register themselves with timm; layers and kernels work without it
    from . import models  # noqa: F401
except ModuleNotFoundError as err:  # pragma: no cover - timm is a declared dependency
    if err.name != "timm":
        raise
