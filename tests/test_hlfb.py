"""litert_torch.hlfb composites: a marked region becomes one op where a composite lowering is registered, and is
lowered op by op otherwise; both match torch eager on the LiteRT interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ai_edge_litert.interpreter import Interpreter

from tpu_export import litert_torch
from tpu_export.litert_torch import hlfb

ATOL = 1e-5  # float32, one region of tanh-approximated gelu (|x| < 4)


def _gelu_tanh(x):
    # the tanh approximation written out: several MUL/ADD/POW ops and a TANH when lowered op by op
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class GeluBlock(torch.nn.Module):
    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        x = self.lin(x)
        b = hlfb.StableHLOCompositeBuilder(name=self.name, attr={"approximate": "tanh"})
        y = b.mark_inputs(x)
        y = b.mark_outputs(_gelu_tanh(y))
        return y * 2.0


def _ops(model) -> list[str]:
    it = Interpreter(model_content=bytes(model.tflite_model()))
    return [d["op_name"] for d in it._get_ops_details()]


def _sample():
    torch.manual_seed(0)
    return torch.randn(3, 16)


def _register_gelu(name):
    @hlfb.composite_lowering(name)
    def gelu(lw, x, *, approximate):
        return lw.op("GELU", [lw.tensor(x)], x.shape, x.dtype, x.perm,
                     lw.options("Gelu", approximate=approximate == "tanh"))

    return gelu


def test_marks_are_identities_in_eager():
    torch.manual_seed(0)
    m = GeluBlock("test_hlfb.eager").eval()
    x = _sample()
    plain = _gelu_tanh(m.lin(x)) * 2.0
    torch.testing.assert_close(m(x), plain, rtol=0, atol=0)


def test_unregistered_composite_is_lowered_op_by_op():
    torch.manual_seed(0)
    m, x = GeluBlock("test_hlfb.unregistered").eval(), _sample()
    model = litert_torch.convert(m, (x,))
    ops = _ops(model)
    assert "TANH" in ops and "GELU" not in ops, ops
    np.testing.assert_allclose(model(x).numpy(), m(x).detach().numpy(), atol=ATOL, rtol=0)


def test_registered_composite_becomes_one_op_with_the_same_numbers():
    name = "test_hlfb.gelu_tanh"
    _register_gelu(name)
    torch.manual_seed(0)
    m, x = GeluBlock(name).eval(), _sample()
    ref = m(x).detach().numpy()
    direct = litert_torch.convert(m, (x,))
    by_op = litert_torch.convert(m, (x,), _litert_converter_flags={"enable_composite_direct_lowering": False})
    assert _ops(direct) == ["FULLY_CONNECTED", "GELU", "MUL"], _ops(direct)
    assert "GELU" not in _ops(by_op) and "TANH" in _ops(by_op)
    np.testing.assert_allclose(direct(x).numpy(), ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(by_op(x).numpy(), ref, atol=ATOL, rtol=0)


def test_several_inputs_and_outputs_and_the_attributes_reach_the_lowering():
    name = "test_hlfb.addmul"
    seen = {}

    @hlfb.composite_lowering(name)
    def addmul(lw, a, b, *, scale, axes):
        seen.update(scale=scale, axes=axes)
        s = lw.tensor(lw.const(np.asarray(scale, a.dtype)))
        add = lw.op("ADD", [lw.tensor(a), lw.tensor(b)], a.shape, a.dtype, a.perm, lw.options("Add"))
        mul = lw.op("MUL", [lw.tensor(add), s], a.shape, a.dtype, a.perm, lw.options("Mul"))
        return add, mul

    class M(torch.nn.Module):
        def forward(self, a, b):
            c = hlfb.StableHLOCompositeBuilder(name, attr={"scale": 3.0, "axes": [0, 1]})
            a, b = c.mark_inputs(a, b)
            s = a + b
            s, p = c.mark_outputs(s, s * 3.0)
            return torch.sin(s) - p

    a, b = torch.randn(2, 5), torch.randn(2, 5)
    model = litert_torch.convert(M().eval(), (a, b))
    assert seen == {"scale": 3.0, "axes": [0, 1]}
    assert _ops(model).count("ADD") == 1 and "SIN" in _ops(model)
    np.testing.assert_allclose(model(a, b).numpy(), M()(a, b).numpy(), atol=1e-6, rtol=0)


def test_a_builder_without_outputs_is_refused():
    class M(torch.nn.Module):
        def forward(self, x):
            b = hlfb.StableHLOCompositeBuilder("test_hlfb.open")
            return b.mark_inputs(x) + 1

    with pytest.raises(ValueError, match="'test_hlfb.open': inputs are marked but no outputs"):
        litert_torch.convert(M().eval(), (torch.ones(2),))


def test_attribute_types_are_checked():
    with pytest.raises(TypeError, match=r"attr\['w'\] is a Tensor"):
        hlfb.StableHLOCompositeBuilder("test_hlfb.bad", attr={"w": torch.ones(2)})
    with pytest.raises(TypeError, match="takes tensors"):
        hlfb.StableHLOCompositeBuilder("test_hlfb.bad").mark_inputs(3)


def test_a_composite_lowering_registers_once():
    from tpu_export.converter.registry import DuplicateLoweringError

    _register_gelu("test_hlfb.twice")
    with pytest.raises(DuplicateLoweringError):
        _register_gelu("test_hlfb.twice")


def test_mark_pattern_is_refused_by_name():
    with pytest.raises(NotImplementedError, match="hlfb.mark_pattern.*StableHLOCompositeBuilder"):
        hlfb.mark_pattern  # noqa: B018


def test_the_tpu_backend_lowers_a_composite_or_its_region_with_the_same_numbers():
    jnp = pytest.importorskip("jax.numpy")
    from tpu_export import converter, tpu_backend

    name = "test_hlfb.tpu_sin"

    class M(torch.nn.Module):
        def forward(self, x):
            b = hlfb.StableHLOCompositeBuilder(name, attr={"k": 2.0})
            return b.mark_outputs(torch.sin(b.mark_inputs(x)) * 2.0) + 1

    x = torch.randn(3, 4)
    ref = M()(x)
    by_op = tpu_backend.export_program(converter.prepare(M().eval(), (x,)))  # marks lowered as identities

    @hlfb.composite_lowering(name, backend="tpu")
    def sin_k(ctx, x, *, k):
        return jnp.sin(x) * k

    prog = hlfb.apply_composites(converter.prepare(M().eval(), (x,)), "tpu")
    targets = [str(n.target) for s in prog.signatures.values() for n in s.graph.nodes if n.op == "call_function"]
    assert any("c_test_hlfb_tpu_sin" in t for t in targets) and "aten.sin.default" not in targets
    direct = tpu_backend.export_program(prog)
    torch.testing.assert_close(by_op(x), ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(direct(x), ref, atol=1e-6, rtol=0)
