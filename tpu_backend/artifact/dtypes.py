"""dtype names as the manifest writes them: the subset of converter.dtypes' table an artifact may hold.

The manifest names dtypes by numpy's spelling ("float32", "bfloat16", "int32", "bool"); the names,
their torch and numpy dtypes and the conversions are converter/dtypes.py's, the one table.
"""

from __future__ import annotations

import numpy as np
import torch

from tpu_export.converter import dtypes as _dt

__all__ = ["DTYPE_NAMES", "torch_to_name", "name_to_numpy", "torch_to_numpy_array", "numpy_to_torch"]

DTYPE_NAMES = frozenset({"float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8",
                         "bool", "complex64"})


def torch_to_name(dtype: torch.dtype) -> str:
    name = _dt.NAMES.get(dtype)
    if name not in DTYPE_NAMES:
        raise TypeError(f"dtype {dtype} is not supported in a TPU artifact; supported: {sorted(DTYPE_NAMES)}")
    return name


def name_to_numpy(name: str) -> np.dtype:
    if name not in DTYPE_NAMES:
        raise TypeError(f"unknown dtype name {name!r}")
    return _dt.numpy_of(name)


def torch_to_numpy_array(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy view (bf16 included) of a tensor, no copy when possible."""
    return _dt.to_numpy(t.detach().contiguous())


numpy_to_torch = _dt.from_numpy
