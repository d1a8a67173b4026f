"""The one lowering contract (converter/registry.py), held by both backends: one argument binder,
one context shape, one support-predicate semantics, errors wrapped once with the user's line, and
op files split by the same families."""

from __future__ import annotations

import inspect
import operator
import pathlib

import numpy as np
import pytest
import torch

from tpu_export import converter, edge
from tpu_export.converter.errors import ConversionError
from tpu_export.converter.registry import (
    OP_FAMILIES,
    LoweringContextBase,
    LoweringError,
    arguments,
    bind_args,
    op_name,
    unbind_args,
)
from tpu_export.tpu_backend.lowering import JAX_LOWERINGS, KERNEL_HOOKS, LoweringContext, lower_signature
from tpu_export.tpu_backend.lowering import lowering as tpu_lowering
from tpu_export.tpu_backend.lowering import supported_if as tpu_supported_if

aten = torch.ops.aten
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _node(target, args, kwargs=None):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    return g.call_function(target, tuple(x if a == "x" else a for a in args), kwargs or {}), x


def test_binder_gives_schema_order_with_defaults_and_keyword_only_arguments():
    n, x = _node(aten.add.Tensor, ("x", "x"), {"alpha": 2})
    assert bind_args(n) == [x, x, 2]
    assert unbind_args(aten.add.Tensor, bind_args(n)) == ([x, x], {"alpha": 2})
    n, x = _node(aten.add.Tensor, ("x", 1.5))
    assert bind_args(n) == [x, 1.5, 1]  # keyword-only alpha defaulted, last
    n, x = _node(aten.avg_pool2d.default, ("x", [2, 2]), {"ceil_mode": True})
    assert bind_args(n) == [x, [2, 2], [], [0, 0], True, True, None]
    assert arguments(n)["padding"] == [0, 0] and arguments(n)["divisor_override"] is None
    n, x = _node(aten.sum.dim_IntList, ("x", [1]))
    assert bind_args(n) == [x, [1], False, None]  # optional keyword-only dtype: None
    n, x = _node(operator.mul, ("x", 3))
    assert bind_args(n) == [x, 3]


def test_binder_names_the_op_and_argument_it_misses():
    n, _ = _node(aten.convolution.default, ("x",))
    with pytest.raises(LoweringError, match=r"aten.convolution.default: argument 'weight' missing at "):
        bind_args(n)
    n, _ = _node(operator.mul, ("x", 3), {"bogus": 1})
    with pytest.raises(LoweringError, match="unexpected keyword arguments"):
        bind_args(n)


@pytest.mark.parametrize("table", [edge.EDGE, JAX_LOWERINGS, KERNEL_HOOKS], ids=lambda t: t.backend)
def test_every_lowering_takes_its_ops_schema_bound_arguments(table):
    import tpu_export.tpu_backend.pallas.hooks  # noqa: F401 - registers the kernel hooks

    bad = []
    for target, fn in table.items():
        schema = getattr(target, "_schema", None)
        if schema is None:
            continue
        try:
            inspect.signature(fn).bind(None, *range(len(schema.arguments)))
        except TypeError as e:
            bad.append(f"{op_name(target)}: {fn.__module__}.{fn.__qualname__}: {e}")
    assert not bad, "\n".join(bad)


def test_both_backends_split_ops_by_the_same_families():
    """An op lowered by both backends lives in edge/ops_<f>.py and tpu_backend/lowering/ops_<f>.py."""
    def family(fn):
        return fn.__module__.rsplit(".", 1)[-1]

    tpu = {t: family(fn) for t, fn in JAX_LOWERINGS.items()}
    both = [t for t in edge.EDGE.targets() if t in tpu and edge.EDGE.get(t).__module__.startswith("tpu_export.edge.")]
    assert len(both) > 150
    mismatched = [f"{op_name(t)}: edge/{family(edge.EDGE.get(t))}.py vs tpu {tpu[t]}.py" for t in both
                  if family(edge.EDGE.get(t)) != tpu[t]]
    assert not mismatched, "\n".join(mismatched)
    for folder in (ROOT / "edge", ROOT / "tpu_backend" / "lowering"):
        files = {p.stem.removeprefix("ops_") for p in folder.glob("ops_*.py")}
        assert files <= set(OP_FAMILIES), (folder, files - set(OP_FAMILIES))


# ------------------------------------------------------------------ contexts, predicates and errors, for real
# Custom ops (one definition per process) whose lowerings probe the contract on both backends.

@torch.library.custom_op("contract_test::two_out", mutates_args=())
def two_out(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2, x.sum(-1).to(torch.int32)


@two_out.register_fake
def _(x):
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.int32)


@torch.library.custom_op("contract_test::picky", mutates_args=())
def picky(x: torch.Tensor, mode: int) -> torch.Tensor:
    return x + mode


@picky.register_fake
def _(x, mode):
    return torch.empty_like(x)


TWO_OUT = torch.ops.contract_test.two_out.default
PICKY = torch.ops.contract_test.picky.default
SEEN: dict = {}


def _record(backend, ctx):
    SEEN[backend] = (ctx.node.name, ctx.out_dtype, ctx.out_shape, ctx.out_dtypes, ctx.out_shapes)


# contract_test::two_out(Tensor x) -> (Tensor, Tensor)
@edge.lowering(TWO_OUT)
def two_out_edge(lw, x):
    _record("edge", lw)
    two = lw.op("MUL", [lw.tensor(x), lw.tensor(lw.const(np.float32(2)))], x.shape, x.dtype, x.perm, lw.options("Mul"))
    s = lw.op("SUM", [lw.tensor(x, tuple(range(x.rank))), lw.const_tensor([x.rank - 1], np.int32)],
              lw.out_shapes[1], np.float32, opts=lw.options("Reducer", keepDims=False))
    return two, lw.cast(s, lw.out_dtypes[1])


@tpu_lowering(TWO_OUT)
def two_out_tpu(ctx, x):
    _record("tpu", ctx)
    return x * 2, x.sum(-1).astype(ctx.out_dtypes[1])


# contract_test::picky(Tensor x, int mode) -> Tensor: mode 0 lowers, mode 1 is unsupported, mode 2 makes the
# predicate raise (a bug in it), mode 3 makes the lowering itself fail
def _picky_pred(node):
    if arguments(node)["mode"] == 2:
        raise ZeroDivisionError("the predicate's own bug")
    return arguments(node)["mode"] != 1


@edge.lowering(PICKY)
@edge.supported_if(_picky_pred)
def picky_edge(lw, x, mode):
    if mode == 3:
        raise ValueError("mode 3 breaks the lowering")
    return lw.alias(x)


@tpu_lowering(PICKY)
@tpu_supported_if(_picky_pred)
def picky_tpu(ctx, x, mode):
    if mode == 3:
        raise ValueError("mode 3 breaks the lowering")
    return x


class TwoOut(torch.nn.Module):
    def forward(self, x):
        a, b = two_out(x)
        return a, b


class Picky(torch.nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def forward(self, x):
        return picky(x, self.mode)  # the line every report names


def _lower(backend, prog):
    if backend == "edge":
        from tpu_export.edge.convert import convert_program

        return convert_program(prog)
    lowered = lower_signature(prog, platforms=("cpu",))
    return lowered.fn([], np.zeros((2, 3), np.float32))


def test_both_contexts_have_one_shape():
    assert issubclass(LoweringContext, LoweringContextBase)
    from tpu_export.edge.lower import Lowerer

    assert issubclass(Lowerer, LoweringContextBase)
    x = torch.randn(2, 3)
    prog = converter.prepare(TwoOut().eval(), (x,))
    for backend in ("edge", "tpu"):
        _lower(backend, prog)
    edge_seen, tpu_seen = SEEN["edge"], SEEN["tpu"]
    assert edge_seen == tpu_seen  # numpy and jnp dtypes compare equal; dims as ints on both
    name, dtype, shape, dtypes, shapes = edge_seen
    assert (dtype, shape, dtypes, shapes) == (np.float32, (2, 3), (np.float32, np.int32), ((2, 3), (2,)))


@pytest.mark.parametrize("backend", ["edge", "tpu"])
def test_a_false_predicate_is_reported_as_unsupported_with_the_users_line(backend):
    prog = converter.prepare(Picky(1).eval(), (torch.randn(2, 3),))
    with pytest.raises(converter.UnsupportedOpsError, match=r"contract_test.picky.default[\s\S]*"
                       r"test_lowering_contract.py.*return picky\(x, self.mode\)"):
        _lower(backend, prog)
    _lower(backend, converter.prepare(Picky(0).eval(), (torch.randn(2, 3),)))


def _lowering_error(backend, mode) -> tuple[LoweringError, str]:
    prog = converter.prepare(Picky(mode).eval(), (torch.randn(2, 3),))
    with pytest.raises(LoweringError) as e:
        _lower(backend, prog)
    msg = str(e.value)
    assert isinstance(e.value, ConversionError) and "\n" not in msg and "return picky(x, self.mode)" in msg, msg
    return e.value, msg


@pytest.mark.parametrize("backend", ["edge", "tpu"])
def test_a_raising_predicate_is_a_bug_named_with_the_op_and_the_users_line(backend):
    err, msg = _lowering_error(backend, 2)
    assert msg.startswith(f"{backend}: the support predicate of contract_test.picky.default (") and "_picky_pred" in msg
    assert "ZeroDivisionError: the predicate's own bug" in msg and isinstance(err.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("backend", ["edge", "tpu"])
def test_a_failing_lowering_is_wrapped_once_with_the_backend_op_and_line(backend):
    err, msg = _lowering_error(backend, 3)
    assert msg.startswith(f"{backend}: lowering contract_test.picky.default (node picky) failed at File "), msg
    assert "test_lowering_contract.py" in msg and msg.endswith("ValueError: mode 3 breaks the lowering"), msg
    assert isinstance(err.__cause__, ValueError)
