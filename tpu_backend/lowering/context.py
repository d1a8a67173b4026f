"""What a lowering sees: the node, the avals of its tensor arguments, its output aval(s), options."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import torch

from tpu_export.converter.dtypes import NARROW, numpy_of
from tpu_export.converter.registry import LoweringContextBase

from .symbolic_dims import resolve_dim

__all__ = ["LoweringOptions", "LoweringContext", "jnp_dtype", "Aval", "PRECISIONS"]

# How a TPU computes a float32 matmul or convolution (XLA's precision config; CPUs and GPUs compute float32
# whatever is asked): "highest" six bf16 MXU passes, float32-exact (torch's numbers, and libtpu's slowest
# compile: ~5x a one-pass program's for a ResNet); "high" three passes (bf16_3x, ~16 mantissa bits);
# "default" one bf16 pass (8 bits), what jax.jit does unless told otherwise. docs/tpu.md has the figures.
PRECISIONS = {"highest": "HIGHEST", "high": "HIGH", "default": "DEFAULT"}

# Float dtypes that dtype="bfloat16" computes in bf16 (float64 only exists with enable_x64,
# where the user asked for it explicitly, so it stays).
_BF16_FROM = {torch.float32, torch.float16}


@dataclasses.dataclass(frozen=True)
class LoweringOptions:
    dtype: str | None = None  # None: the model's dtypes; "bfloat16": floats computed in bf16
    platforms: tuple = ("tpu", "cpu")
    use_pallas: Any = False  # True | False | "auto" | tpu_backend.pallas.PallasConfig (kernel hooks)
    x64: bool = False  # the Program keeps 64-bit values (enable_x64); else they are 32-bit
    generation: str | None = None  # TPU generation the kernels' block sizes are chosen for (None: any)
    precision: str = "highest"  # float32 matmul/conv passes on TPU: one of PRECISIONS

    def __post_init__(self):
        if self.dtype not in (None, "bfloat16"):
            raise ValueError(f"dtype must be None or 'bfloat16', got {self.dtype!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        self.pallas  # noqa: B018 - validates use_pallas / generation now, not at the first kernel

    @property
    def pallas(self):
        """The PallasConfig the kernel hooks use, or None when kernels are off."""
        from ..pallas.config import PallasConfig

        cfg = self.use_pallas
        if not isinstance(cfg, PallasConfig):
            if cfg not in (True, False, "auto"):
                raise ValueError(f"use_pallas must be True, False, 'auto' or a PallasConfig, got {cfg!r}")
            cfg = PallasConfig(mode=cfg, generation=self.generation)
        elif cfg.generation is None and self.generation is not None:
            cfg = dataclasses.replace(cfg, generation=self.generation)
        return None if cfg.mode is False else cfg


# The 64->32 bit policy, applied again here: a value the converter left 64-bit (a folded
# constant, an unused int64 index output) must not ask jax for a dtype it does not have.


def jnp_dtype(torch_dtype: torch.dtype, options: LoweringOptions | None = None):
    if options is not None and options.dtype == "bfloat16" and torch_dtype in _BF16_FROM:
        return jnp.dtype(jnp.bfloat16)
    if options is None or not options.x64:
        torch_dtype = NARROW.get(torch_dtype, torch_dtype)
    try:
        return jnp.dtype(numpy_of(torch_dtype))
    except TypeError:
        raise TypeError(f"dtype {torch_dtype} has no JAX equivalent") from None


@dataclasses.dataclass(frozen=True)
class Aval:
    shape: tuple  # ints and, under jax.export shape polymorphism, symbolic dims
    dtype: Any  # a numpy/jnp dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclasses.dataclass
class LoweringContext(LoweringContextBase):
    """The contract's context (``node``, ``out_dtype(s)``, ``out_shape(s)``: jnp dtypes, jax.export
    dims) plus the TPU's: the argument avals, the lowering options, symbolic dims."""

    node: torch.fx.Node
    in_avals: list  # Aval of each jax-array argument, in argument order
    options: LoweringOptions
    sym_env: dict = dataclasses.field(default_factory=dict, repr=False)  # torch symbol -> jax dim

    def _dtype(self, torch_dtype):
        return jnp_dtype(torch_dtype, self.options)

    def _shape(self, val) -> tuple:
        return tuple(resolve_dim(d, self.sym_env) for d in val.shape)

    def _aval(self, val) -> Aval | None:
        if not isinstance(val, torch.Tensor):
            return None
        return Aval(self._shape(val), self._dtype(val.dtype))

    @functools.cached_property
    def out_aval(self) -> Aval:
        """The output aval (the first one for multi-output ops)."""
        val = self.node.meta["val"]
        if isinstance(val, (tuple, list)):
            val = val[0]
        return self._aval(val)

    @functools.cached_property
    def out_avals(self) -> tuple:
        val = self.node.meta["val"]
        vals = val if isinstance(val, (tuple, list)) else (val,)
        return tuple(self._aval(v) for v in vals)

    @property
    def out_dtype(self):
        return self.out_aval.dtype  # the cached aval: lowerings read it several times

    @property
    def out_shape(self) -> tuple:
        return self.out_aval.shape

    def precision(self, dtype=None):
        """The matmul/conv precision of a float32 (or float64) computation: the options' ``precision``
        (default "highest": float32 parity with torch; TPUs would otherwise use one bf16 pass); None (the
        platform's default) for bf16/f16 compute."""
        dtype = jnp.dtype(dtype if dtype is not None else self.out_dtype)
        if dtype in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
            return getattr(jax.lax.Precision, PRECISIONS[self.options.precision])
        return None

    def arg_meta(self, i: int):
        """The fake tensor (or value) of the node's i-th positional argument."""
        a = self.node.args[i] if i < len(self.node.args) else None
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    def used_outputs(self) -> set:
        """Indices of a multi-output node's results that some getitem reads."""
        import operator

        return {u.args[1] for u in self.node.users if u.target is operator.getitem}
