"""dtype names as the manifest writes them, and their torch / numpy counterparts.

The manifest names dtypes by numpy's spelling ("float32", "bfloat16", "int32", "bool");
bfloat16 and the float8 types come from ml_dtypes (a jax dependency) since numpy lacks them.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["DTYPE_NAMES", "torch_to_name", "name_to_numpy", "torch_to_numpy_array",
           "numpy_to_torch"]

_TORCH = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool",
    torch.complex64: "complex64",
}
_FROM_NAME = {v: k for k, v in _TORCH.items()}
DTYPE_NAMES = frozenset(_FROM_NAME)


def torch_to_name(dtype: torch.dtype) -> str:
    try:
        return _TORCH[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported in a TPU artifact; supported: {sorted(DTYPE_NAMES)}") from None


def name_to_numpy(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name not in DTYPE_NAMES:
        raise TypeError(f"unknown dtype name {name!r}")
    return np.dtype(name)


def torch_to_numpy_array(t: torch.Tensor) -> np.ndarray:
    """A numpy view (bf16 included, through ml_dtypes) of a CPU tensor, no copy when possible."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous() if not t.is_contiguous() else t
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(name_to_numpy("bfloat16"))
    return t.numpy()


def numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    """Numpy (or a jax array turned numpy) -> torch, bf16 included. Copies read-only buffers."""
    a = np.asarray(a)
    if a.dtype == name_to_numpy("bfloat16"):
        return torch.from_numpy(np.array(a.view(np.int16))).view(torch.bfloat16)
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, copy=True, order="C")
    return torch.from_numpy(a)
