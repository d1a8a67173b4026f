"""Imports every op module once, which registers its lowerings in JAX_LOWERINGS."""

from . import (  # noqa: F401
    ops_activation,
    ops_attention,
    ops_conv,
    ops_creation,
    ops_elementwise,
    ops_index,
    ops_logical,
    ops_nn,
    ops_norm,
    ops_pool,
    ops_reduce,
    ops_resize,
    ops_sampling,
    ops_shape,
    ops_slice,
    ops_symbolic,
)
