"""The one dtype table: torch dtypes, the names artifacts and metadata write (numpy's spelling), their
numpy dtypes, and the 64 -> 32-bit narrowing policy both backends apply.

bfloat16 has no numpy dtype of its own: it comes from ml_dtypes (a jax dependency), imported only
when a bfloat16 value is met. Backends map these to their own types (jnp dtypes, LiteRT TensorType).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["NAMES", "NARROW", "numpy_of", "numpy_narrow", "to_numpy", "from_numpy"]

NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64",
    torch.int8: "int8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64",
    torch.uint8: "uint8", torch.uint16: "uint16", torch.uint32: "uint32", torch.uint64: "uint64",
    torch.bool: "bool", torch.complex64: "complex64", torch.complex128: "complex128",
}
_BY_NAME = {v: k for k, v in NAMES.items()}

# The 64 -> 32-bit policy: LiteRT and TPUs run 32-bit values (converter/passes/dtype_policy.py applies it to
# the program unless enable_x64; runtimes narrow the caller's values the same way).
NARROW: dict[torch.dtype, torch.dtype] = {torch.int64: torch.int32, torch.float64: torch.float32,
                                          torch.complex128: torch.complex64}

_NUMPY: dict[str, np.dtype] = {}


def numpy_of(dtype) -> np.dtype:
    """The numpy dtype of a dtype name or torch dtype (bfloat16 through ml_dtypes)."""
    name = NAMES.get(dtype) if isinstance(dtype, torch.dtype) else dtype
    d = _NUMPY.get(name)
    if d is None:
        if name == "bfloat16":
            import ml_dtypes

            d = np.dtype(ml_dtypes.bfloat16)
        elif name in _BY_NAME:
            d = np.dtype(name)
        else:
            raise TypeError(f"unknown dtype {dtype!r}; known: {sorted(_BY_NAME)}")
        _NUMPY[name] = d
    return d


def numpy_narrow(dtype: np.dtype) -> np.dtype:
    """``dtype`` under the narrowing policy (itself when the policy leaves it)."""
    t = _NUMPY_TO_TORCH.get(np.dtype(dtype))
    return np.dtype(NAMES[NARROW[t]]) if t in NARROW else np.dtype(dtype)


_NUMPY_TO_TORCH = {np.dtype(n): t for t, n in NAMES.items() if n != "bfloat16"}


def to_numpy(x) -> np.ndarray:
    """A torch tensor (bf16 included), numpy array or Python value as numpy, without a copy where possible."""
    if isinstance(x, torch.Tensor):
        # attribute checks, not detach()/device.type: this runs on every call of a small model
        if x.requires_grad:
            x = x.detach()
        if not x.is_cpu:
            x = x.cpu()
        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.int16).numpy().view(numpy_of("bfloat16"))
        return x.numpy()
    return np.asarray(x)


def from_numpy(a) -> torch.Tensor:
    """Numpy (or an array-like such as a jax array) -> torch, bf16 included. Copies read-only buffers."""
    a = np.asarray(a)
    if a.dtype == numpy_of("bfloat16"):
        return torch.from_numpy(np.array(a.view(np.int16))).view(torch.bfloat16)
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, copy=True, order="C")
    return torch.from_numpy(a)
