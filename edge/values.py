"""What a lowered fx value is on the LiteRT side: a tensor in some layout, or a constant."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from tpu_export.converter.dtypes import numpy_of

__all__ = ["Val", "SymVal", "np_dtype"]

# The dtypes LiteRT tensors take here; bfloat16 has no LiteRT kernels: widened to float32.
_LITERT = {torch.float32, torch.float16, torch.int32, torch.int64, torch.bool, torch.int8, torch.uint8, torch.int16,
           torch.float64}


def np_dtype(dtype) -> np.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype == torch.bfloat16:
            return np.dtype(np.float32)
        if dtype not in _LITERT:
            raise TypeError(f"edge: dtype {dtype} has no LiteRT tensor type")
        return numpy_of(dtype)
    return np.dtype(dtype)


@dataclasses.dataclass(eq=False)
class Val:
    """A tensor value. ``shape`` is the torch (logical) shape, None marking a dynamic dim;
    physical dim i of ``tensor`` holds logical dim ``perm[i]``. A value known at conversion
    time has ``const`` (in logical layout) and gets a tensor only when an op reads it."""

    shape: tuple
    dtype: np.dtype
    perm: tuple
    tensor: int | None = None
    const: np.ndarray | None = None
    producer: object = None  # the OperatorT that wrote ``tensor`` (for activation fusion)
    users: int = 0  # fx users of the node this value came from
    layouts: dict = dataclasses.field(default_factory=dict)  # perm -> tensor index (cache)
    # (scale, shift) over the last logical dim still to apply: a norm's affine left for its
    # readers, all of them linear layers that fold it into their weights (see ops_nn)
    pending_affine: tuple | None = None
    name: str | None = None  # a weight's name: its constant tensor is named after it

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def phys_shape(self, perm=None) -> tuple:
        return tuple(self.shape[p] for p in (self.perm if perm is None else perm))

    @property
    def static(self) -> bool:
        return all(d is not None for d in self.shape)


@dataclasses.dataclass(eq=False)
class SymVal:
    """A symbolic int (from dynamic shapes): ``value`` when known, else how to compute it:
    ("dim", Val, logical dim) or (python operator, SymVal|int, SymVal|int)."""

    value: int | None
    expr: tuple = ()
    tensor: int | None = None  # int32 [1] tensor, built on demand
