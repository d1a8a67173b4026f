"""The node-by-node decomposition of a fresh export (converter/lean_decompose.py).

It must give the same core-ATen program as run_decompositions, and must decline (so the pipeline
re-traces) whenever an in-place op could be seen through an alias.
"""

import collections

import pytest
import torch

from tests.converter.test_pipeline import rel_err
from tests.zoo import build
from tpu_export.converter import prepare, run_program
from tpu_export.converter.capture import capture
from tpu_export.converter.decompositions import KEEP_WHOLE, _plain_table, decompose
from tpu_export.converter.lean_decompose import NeedsFullRetrace, decompose_in_place

KEEP = frozenset(KEEP_WHOLE)


def lean(module, args, **kw):
    ep = capture(module, args, **kw)
    decompose_in_place(ep, _plain_table(KEEP), KEEP)
    return ep


def histogram(ep):
    return collections.Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "efficientnet", "convnext", "swin", "t5"])
def test_same_program_as_run_decompositions(name):
    module, args = build(name)
    full = histogram(decompose(capture(module, args)))
    ep = lean(module, args)
    got = histogram(ep)
    # Differences allowed: eval-mode dropout leaves no clone, and no _assert_tensor_metadata.
    for op in ("aten.clone.default", "aten._assert_tensor_metadata.default"):
        full.pop(op, None)
        got.pop(op, None)
    assert got == full
    assert not [n for n in ep.graph.nodes if n.op == "call_function"
                and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable]
    want = module(*args)
    out = ep.module()(*args)
    assert rel_err(out, want) <= 1e-6


class InPlace(torch.nn.Module):
    def forward(self, x):
        a = x * 2
        b = a + 1  # reads a before the in-place write
        a.mul_(3)
        c = torch.relu_(a - b)
        c += x
        return a + b + c


def test_in_place_ops_become_functional():
    x = torch.randn(4, 5)
    ep = lean(InPlace().eval(), (x,))
    ops = histogram(ep)
    assert "aten.mul_.Tensor" not in ops and "aten.relu_.default" not in ops and "aten.add_.Tensor" not in ops
    assert ops["aten.mul.Tensor"] == 2 and ops["aten.relu.default"] == 1
    assert rel_err(ep.module()(x), InPlace().eval()(x)) <= 1e-6


class WriteThroughView(torch.nn.Module):
    def forward(self, x):
        h = x * 2
        v = h.view(-1)
        v.add_(1)  # changes h too
        return h * 3


class WriteToView(torch.nn.Module):
    def forward(self, x):
        h = (x * 2).transpose(0, 1)
        h.sub_(1)
        return h


@pytest.mark.parametrize("cls", [WriteThroughView, WriteToView])
def test_in_place_through_an_alias_declines_and_the_pipeline_retraces(cls):
    x = torch.randn(3, 4)
    with pytest.raises(NeedsFullRetrace):
        lean(cls().eval(), (x,))
    prog = prepare(cls().eval(), (x,))
    assert rel_err(run_program(prog, x), cls().eval()(x)) <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "vit", "llama"])
def test_dynamic_batch_same_program_as_run_decompositions(name):
    module, args = build(name)
    args = tuple(torch.cat([a, a]) for a in args)
    dyn = tuple({0: torch.export.Dim("batch", min=1, max=8)} for _ in args)
    full = histogram(decompose(capture(module, args, dynamic_shapes=dyn)))
    got = histogram(lean(module, args, dynamic_shapes=dyn))
    for op in ("aten.clone.default", "aten._assert_tensor_metadata.default"):
        full.pop(op, None)
        got.pop(op, None)
    assert got == full
    prog = prepare(module, args, dynamic_shapes=dyn)
    small = tuple(a[:1] for a in args)
    assert rel_err(run_program(prog, *small), module(*small)) <= 1e-5


class DataDependent(torch.nn.Module):
    def forward(self, x):
        return x[x > 0].sum() + x.nonzero().shape[0]


def test_data_dependent_shapes_decline():
    x = torch.randn(4, 5)
    with pytest.raises(NeedsFullRetrace, match="data-dependent"):
        lean(DataDependent().eval(), (x,))


def test_a_callers_exported_program_is_left_untouched():
    module, args = build("resnet18")
    ep = torch.export.export(module, args)
    before = histogram(ep)
    prepare(ep, args)
    assert histogram(ep) == before and "aten.relu_.default" in before
