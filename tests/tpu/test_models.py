"""Every tests.zoo model through the TPU lowering table, compared with torch eager.

- static: ``jax.jit(fn)`` on CPU at the sample batch, rel err <= 1e-4 on every output;
- dynamic batch: ``jax.export`` with a symbolic "batch" dim, one export run at batch 1 and 4;
- the same function lowers for TPU (StableHLO for ``platforms=["tpu", "cpu"]``, no TPU needed), and the TPU's
  own form (channels-last convolutions) runs here as the model;
- dtype="bfloat16" on a few models, with the looser bounds stated below.

Error measure: max|got - want| / max(max|want|, 1e-6), over each output.
"""

from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from jax import export as jax_export

from tests.numerics import rel_err
from tests.zoo import ZOO, batch_like
from tpu_export import converter
from tpu_export.tpu_backend.lowering import lower_signature

pytestmark = [pytest.mark.slow]

FP32_RTOL = 1e-4
# bf16 keeps 8 mantissa bits (eps 2**-8); through 10-20 layers of matmuls/convs and norms the
# relative error grows to a few percent (measured: 0.3%-4.6%, resnet18 the largest).
BF16_RTOL = {"resnet18": 1e-1, "mobilenet_v3": 5e-2, "vit": 5e-2, "bert": 5e-2, "llama": 5e-2, "t5": 5e-2}


def _inputs(lowered, args):
    return [np.asarray(a.numpy()).astype(dt) for a, dt in zip(lowered.signature.flatten_inputs(args),
                                                              lowered.input_dtypes)]


def _prepare(module, args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # int64 token ids become int32 (the dtype policy warns)
        return converter.prepare(module, args, **kw)


@functools.lru_cache(maxsize=None)
def _static(name):
    """(module, args, Program) of a zoo model at its sample batch; the fp32, TPU-export and
    bf16 tests of a model share it when they land on the same worker (torch.export is slow)."""
    module, args = ZOO[name].build()
    return module, args, _prepare(module, args)


def _check(name, got, module, args, rtol):
    with torch.no_grad():
        want = pytree.tree_leaves(module(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        err = rel_err(g, w)
        assert err <= rtol, f"{name}: rel err {err:.3g} > {rtol:g}"


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_matches_torch(name):
    module, args, prog = _static(name)
    lowered = lower_signature(prog)
    got = jax.jit(lowered.fn)(lowered.weight_arrays(prog), *_inputs(lowered, args))
    _check(name, got, module, args, FP32_RTOL)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_tpu_form_matches_torch(name):
    """The TPU's program (convolution activations channels-last: lowering/channels_last.py), run on this CPU."""
    module, args, prog = _static(name)
    lowered = lower_signature(prog, platforms=("tpu",))
    got = jax.jit(lowered.fn)(lowered.weight_arrays(prog), *_inputs(lowered, args))
    _check(name, got, module, args, FP32_RTOL)


_DYNAMIC = sorted(n for n, e in ZOO.items() if e.dynamic_batch)


# the CPU's form of every model; the TPU's form (run here) of the convolutional ones
@pytest.mark.parametrize("name, form", [(n, "cpu") for n in _DYNAMIC]
                         + [(n, "tpu") for n in ("resnet18", "regnet", "convnext") if n in _DYNAMIC])
def test_zoo_model_symbolic_batch(name, form):
    module, args = ZOO[name].build()
    batch = torch.export.Dim("batch", min=1, max=64)
    traced = batch_like(args, 2)  # a batch-1 sample would be specialised by torch.export
    prog = _prepare(module, traced, dynamic_shapes=tuple({0: batch} for _ in traced))
    lowered = lower_signature(prog, platforms=("tpu",) if form == "tpu" else ("tpu", "cpu"))
    w_avals, in_avals = lowered.abstract_args()
    assert all(str(a.shape[0]) == "batch" for a in in_avals), in_avals
    exported = jax_export.export(jax.jit(lowered.fn), platforms=["cpu"])(w_avals, *in_avals)
    weights = lowered.weight_arrays(prog)
    for n in (1, 4):
        run_args = batch_like(args, n, seed=n)
        got = exported.call(weights, *_inputs(lowered, run_args))
        _check(f"{name} at batch {n}", got, module, run_args, FP32_RTOL)


@pytest.mark.parametrize("name", ["mobilenet_v3", "llama"])
def test_zoo_model_lowers_for_tpu(name):
    module, args, prog = _static(name)
    lowered = lower_signature(prog, platforms=("tpu", "cpu"))
    w_avals, in_avals = lowered.abstract_args()
    exported = jax_export.export(jax.jit(lowered.fn), platforms=["tpu", "cpu"])(w_avals, *in_avals)
    assert exported.platforms == ("tpu", "cpu")
    text = exported.mlir_module()
    assert "stablehlo" in text
    got = exported.call(lowered.weight_arrays(prog), *_inputs(lowered, args))  # the cpu lowering
    _check(name, got, module, args, FP32_RTOL)


@pytest.mark.parametrize("name", sorted(BF16_RTOL))
def test_zoo_model_bfloat16(name):
    module, args, prog = _static(name)
    lowered = lower_signature(prog, dtype="bfloat16")
    assert all(dt == jax.numpy.bfloat16 for dt in lowered.output_dtypes)
    got = jax.jit(lowered.fn)(lowered.weight_arrays(prog), *_inputs(lowered, args))
    assert all(g.dtype == jax.numpy.bfloat16 for g in got)
    _check(name, [np.asarray(g, np.float32) for g in got], module, args, BF16_RTOL[name])
