"""Hand-written JAX references of the benchmark's real-size architectures (bench/real_models.py), for
comparing the converter's TPU programs against what a JAX user would write: NHWC activations, HWIO kernels,
BatchNorm folded into the convs, weights passed in as a pytree of arrays.

    ref = reference(name, torch_module, torch_args, dtype="float32", precision=None)
    ref.fn(ref.params, *ref.inputs)        # pure and jittable; every weight comes from params
    ref.outputs_like_torch(out)            # float32 numpy arrays in torch's layout and output order

``dtype`` "bfloat16" casts the params and the float inputs to bfloat16 (the forward then runs in
bfloat16; LayerNorm statistics are taken in float32); outputs come back as float32 either way.
``precision`` "highest" puts lax.Precision.HIGHEST on every conv and matmul; None leaves lax's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

__all__ = ["MODELS", "DTYPES", "PRECISIONS", "Reference", "reference"]

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf",
          "vit_b_16", "bert_base")
DTYPES = ("float32", "bfloat16")
PRECISIONS = (None, "highest")


@dataclass(frozen=True)
class Reference:
    name: str
    fn: Callable[..., Any]
    params: Any
    inputs: list

    def outputs_like_torch(self, out) -> list[np.ndarray]:
        """fn's result as torch's flattened outputs: the logits (N, classes) for the image models,
        [last_hidden_state, pooler_output] for BERT (sequence outputs are (N, L, C) in both layouts)."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [np.asarray(o, dtype=np.float32) for o in outs]


def _builder(name: str):
    from . import bert, convnets, convnext, vit

    return {"resnet18": convnets.resnet, "resnet50": convnets.resnet, "mobilenet_v2": convnets.mobilenet_v2,
            "efficientnet_b0": convnets.efficientnet, "regnet_y_400mf": convnets.regnet_y,
            "convnext_tiny": convnext.convnext, "vit_b_16": vit.vit, "bert_base": bert.bert}[name]


def reference(name: str, torch_module, torch_args, dtype: str = "float32", precision: str | None = None) -> Reference:
    """The JAX reference of ``name`` carrying ``torch_module``'s weights and ``torch_args`` as its inputs."""
    if name not in MODELS:
        raise ValueError(f"no JAX reference for {name!r}; known models: {', '.join(MODELS)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: None or 'highest'")
    import jax
    import jax.numpy as jnp

    lax_precision = jax.lax.Precision.HIGHEST if precision == "highest" else None
    params64, core = _builder(name)(torch_module, lax_precision)
    np_dtype = np.dtype(jnp.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    params = jax.tree.map(lambda a: np.asarray(a, dtype=np_dtype), params64)
    if name == "bert_base":
        inputs = [t.detach().cpu().numpy().astype(np.int32) for t in torch_args]
    else:
        inputs = [t.detach().cpu().numpy().transpose(0, 2, 3, 1).astype(np_dtype) for t in torch_args]

    def fn(params, *inputs):
        inputs = [x.astype(np_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in inputs]
        return jax.tree.map(lambda o: o.astype(jnp.float32), core(params, *inputs))

    return Reference(name, fn, params, inputs)
