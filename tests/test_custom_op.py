"""A user's torch.library custom op, lowered by the user for both backends through the public
lowering contract (edge.lowering, tpu_backend.lowering.lowering), converted to a .tflite and a
TPU bundle, both matching torch eager."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tests.numerics import rel_err
from tpu_export import converter, edge, tpu_backend
from tpu_export.converter.decompositions import decompose
from tpu_export.converter.registry import DuplicateLoweringError
from tpu_export.tpu_backend.lowering import lowering as tpu_lowering

aten = torch.ops.aten


# Defined once per process (a namespace::name can be defined only once), like a user's library.
@torch.library.custom_op("tpu_export_test::scale_tanh", mutates_args=())
def scale_tanh(x: torch.Tensor, scale: float = 2.0, *, shift: float = 0.0) -> torch.Tensor:
    return torch.tanh(x * scale + shift)


@scale_tanh.register_fake
def _(x, scale=2.0, *, shift=0.0):
    return torch.empty_like(x)


@torch.library.custom_op("tpu_export_test::edge_only", mutates_args=())
def edge_only(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@edge_only.register_fake
def _(x):
    return torch.empty_like(x)


SCALE_TANH = torch.ops.tpu_export_test.scale_tanh.default
EDGE_ONLY = torch.ops.tpu_export_test.edge_only.default


# tpu_export_test::scale_tanh(Tensor x, float scale=2.0, *, float shift=0.0) -> Tensor
# The arguments come schema-bound on both backends: defaults filled, the keyword-only shift last.
@edge.lowering(SCALE_TANH)
def scale_tanh_edge(lw, x, scale, shift):
    def scalar(v):
        return lw.tensor(lw.const(np.asarray(v, x.dtype)))

    y = lw.op("MUL", [lw.tensor(x), scalar(scale)], x.shape, x.dtype, x.perm, lw.options("Mul"))
    y = lw.op("ADD", [lw.tensor(y), scalar(shift)], x.shape, x.dtype, x.perm, lw.options("Add"))
    return lw.op("TANH", [lw.tensor(y)], x.shape, x.dtype, x.perm)


@tpu_lowering(SCALE_TANH)
def scale_tanh_tpu(ctx, x, scale, shift):
    import jax.numpy as jnp

    return jnp.tanh(x * scale + shift).astype(ctx.out_dtype)


# tpu_export_test::edge_only(Tensor x) -> Tensor: lowered for the edge backend only
@edge.lowering(EDGE_ONLY)
def edge_only_edge(lw, x):
    three = lw.tensor(lw.const(np.asarray(3, x.dtype)))
    return lw.op("MUL", [lw.tensor(x), three], x.shape, x.dtype, x.perm, lw.options("Mul"))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return scale_tanh(self.fc(x), shift=0.25) + scale_tanh(x, 0.5)


def _x():
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(0))


def _net():
    torch.manual_seed(0)
    return Net().eval()


def _run_edge(prog, x):
    from tpu_export.edge.convert import convert_program
    from tpu_export.edge.inspect import run_tflite

    (out,) = run_tflite(convert_program(prog), {prog.signature().inputs[0].name: x.numpy()}).values()
    return out


def test_custom_op_converts_to_a_tflite_and_a_tpu_bundle_matching_torch(tmp_path):
    from tpu_export import litert_torch
    from tpu_export.edge import op_histogram

    m, x = _net(), _x()
    with torch.no_grad():
        want = m(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = litert_torch.convert(m, (x,))
    assert rel_err(model(x), want) <= 1e-5
    hist = op_histogram(model.tflite_model())
    assert hist.get("TANH") == 2 and hist.get("MUL", 0) >= 2, hist  # the user's lowering ran, twice

    prog = converter.prepare(m, (x,))
    assert prog.signature().op_histogram().get("tpu_export_test.scale_tanh.default") == 2
    bundle = tpu_backend.export_program(prog, platforms=("cpu",))
    assert rel_err(np.asarray(bundle(x)), want) <= 1e-5
    bundle.save(tmp_path / "m.tpuexp")  # the artifact holds plain StableHLO: loads without the op
    assert rel_err(np.asarray(tpu_backend.load(tmp_path / "m.tpuexp")(x)), want) <= 1e-5


@pytest.mark.parametrize("in_place", [True, False], ids=["node-by-node", "re-trace"])
def test_decomposition_keeps_the_custom_op_whole(in_place):
    ep = torch.export.export(_net(), (_x(),))
    ops = [n.target for n in decompose(ep, in_place=in_place).graph.nodes if n.op == "call_function"]
    assert ops.count(SCALE_TANH) == 2, ops


class EdgeOnlyNet(torch.nn.Module):
    def forward(self, x):
        return edge_only(x) + 1  # the line the report must name


def test_op_without_a_lowering_is_reported_with_the_users_line_before_anything_is_written(tmp_path):
    prog = converter.prepare(EdgeOnlyNet().eval(), (_x(),))
    out = tmp_path / "m.tpuexp"
    with pytest.raises(converter.UnsupportedOpsError) as e:
        tpu_backend.export_program(prog, platforms=("cpu",)).save(out)
    msg = str(e.value)
    assert "tpu_export_test.edge_only.default" in msg and "aten.add" not in msg, msg
    assert "test_custom_op.py" in msg and "return edge_only(x) + 1" in msg, msg
    assert not out.exists()
    assert rel_err(_run_edge(prog, _x()), _x() * 3 + 1) <= 1e-6  # the edge backend lowers it


def test_a_second_registration_names_both_sites():
    def again(lw, x, scale, shift):
        return x

    with pytest.raises(DuplicateLoweringError) as e:
        edge.lowering(SCALE_TANH)(again)
    msg = str(e.value)
    assert "scale_tanh_edge" in msg and "test_a_second_registration_names_both_sites.<locals>.again" in msg, msg
    assert "test_custom_op.py:" in msg and "override=True" in msg, msg
    assert edge.EDGE.get(SCALE_TANH) is scale_tanh_edge  # the first one stays


class Neg(torch.nn.Module):
    def forward(self, x):
        return -x


@pytest.mark.parametrize("backend", ["edge", "tpu"])
def test_override_replaces_an_aten_lowering(backend):
    import jax.numpy as jnp

    from tpu_export.tpu_backend.lowering import JAX_LOWERINGS, lower_signature

    table = edge.EDGE if backend == "edge" else JAX_LOWERINGS
    x = _x()
    prog = converter.prepare(Neg().eval(), (x,))

    def run():
        if backend == "edge":
            return _run_edge(prog, x)
        return np.asarray(lower_signature(prog, platforms=("cpu",)).fn([], x.numpy())[0])

    def abs_edge(lw, v):  # a visibly different lowering: |x| instead of -x
        return lw.op("ABS", [lw.tensor(v)], v.shape, v.dtype, v.perm)

    builtin = table.get(aten.neg.default)
    with pytest.raises(DuplicateLoweringError):
        table.lowering(aten.neg.default)(builtin)
    table.lowering(aten.neg.default, override=True)(abs_edge if backend == "edge" else lambda ctx, v: jnp.abs(v))
    try:
        np.testing.assert_array_equal(run(), x.abs().numpy())
    finally:
        table.lowering(aten.neg.default, override=True)(builtin)
    np.testing.assert_array_equal(run(), (-x).numpy())
