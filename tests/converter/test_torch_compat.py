"""converter/_torch_compat.py on the running torch (tests/test_no_private_torch.py keeps the rest of the code off them).

Every function of the compat module has a ``test_<function>`` here that calls it for real (a tiny exported
program, a real FakeTensorMode, a real .pt2 written by torch.export.save) and checks what it returns
against torch's own behaviour, so a torch release that moves or changes a private name fails here.
The public replacements listed in ``REPLACED`` are checked to agree with the private names they replaced.
"""

from __future__ import annotations

import contextlib
import copy
import json
import operator
import os
import sys
import zipfile

import pytest
import torch

from tests.write_torch_compat_doc import DOCS, render
from tpu_export.converter import _torch_compat as c

aten = torch.ops.aten
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 3))

    def forward(self, x):
        return torch.relu(self.fc(x)) * self.scale


def _exported(dynamic: bool = False):
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    shapes = {"x": {0: torch.export.Dim("batch", min=1, max=64)}} if dynamic else None
    return _Tiny().eval(), x, torch.export.export(_Tiny().eval(), (x,), dynamic_shapes=shapes)


def _placeholder_vals(ep):
    return [n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder"]


# --- every function is recorded, documented and tested ------------------------------------------


def _functions():
    return [n for n in c.__all__ if callable(getattr(c, n)) and not isinstance(getattr(c, n), type)]


def test_every_function_records_its_private_use_and_has_a_test():
    recorded = [u.function for u in c.USES]
    assert sorted(recorded) == sorted(_functions()), "each function of _torch_compat is decorated with _private"
    assert len(set(recorded)) == len(recorded)
    for name in recorded:
        doc = getattr(c, name).__doc__
        assert "Private torch API" in doc and "2.13.0 and 2.14.1" in doc and "Public alternative" in doc, name
        assert callable(globals().get(f"test_{name}")), f"no test_{name} in {__file__}"


@pytest.mark.subprocess
def test_importing_compat_loads_no_torch_module():
    import subprocess

    code = ("import sys; import tpu_export.converter._torch_compat; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


# --- operators ----------------------------------------------------------------------------------


def test_is_op_overload():
    _, _, ep = _exported()
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets and all(c.is_op_overload(t) for t in targets)
    assert c.is_op_overload(aten.add.Tensor)
    for other in (aten.add, operator.getitem, operator.mul, torch.sym_max, torch.relu, "aten.add.Tensor"):
        assert not c.is_op_overload(other), other


def test_op_schema():
    s = c.op_schema(aten.add.Tensor)
    assert s.name == "aten::add" and s.overload_name == "Tensor"
    assert [a.name for a in s.arguments] == ["self", "other", "alpha"]
    assert not s.is_mutable and c.op_schema(aten.add_.Tensor).is_mutable
    assert c.op_schema(aten.relu.default).overload_name == ""
    view = c.op_schema(aten.view.default)
    assert view.returns[0].alias_info is not None and not view.returns[0].alias_info.is_write
    assert c.op_schema(aten.relu_.default).arguments[0].alias_info.is_write
    for other in (operator.add, torch.sym_max, aten.add):
        assert c.op_schema(other) is None


def test_registered_op_names():
    names = c.registered_op_names()
    assert {"aten::add.Tensor", "aten::relu", "aten::convolution"} <= set(names)
    # names a fresh process has not touched yet are listed too, and each resolves to an op
    for n in [n for n in names if n.startswith("aten::")][:200]:
        packet, _, ov = n[len("aten::"):].partition(".")
        op = getattr(getattr(aten, packet), ov or "default")
        assert c.is_op_overload(op) and op.name() == n


@pytest.mark.subprocess
def test_register_quantized_decomposed_ops():
    """In a fresh process the quantize op is unknown until the call registers it, and then it computes."""
    import subprocess

    code = ("import torch\n"
            "from tpu_export.converter import _torch_compat as c\n"
            "before = hasattr(torch.ops.quantized_decomposed, 'quantize_per_tensor')\n"
            "c.register_quantized_decomposed_ops()\n"
            "q = torch.ops.quantized_decomposed.quantize_per_tensor.default(\n"
            "    torch.tensor([0.5, -1.0]), 0.25, 0, -128, 127, torch.int8)\n"
            "print(before, q.tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split("\n")[-2] == "False [2, -4]", out.stdout[-500:]


# --- fake tensors and symbolic shapes -----------------------------------------------------------


def test_detect_fake_mode():
    _, _, ep = _exported()
    vals = _placeholder_vals(ep)
    mode = c.detect_fake_mode(vals)
    assert mode is not None and all(v.fake_mode is mode for v in vals)
    assert c.detect_fake_mode([torch.ones(2)]) is None
    fresh = c.new_fake_mode()
    with fresh:
        assert c.detect_fake_mode([]) is fresh  # the active mode


def test_new_fake_mode():
    mode = c.new_fake_mode()
    fake = mode.from_tensor(torch.ones(2, 3), static_shapes=True)
    assert fake.shape == (2, 3) and c.detect_fake_mode([fake]) is mode
    with mode:
        y = torch.ones(5, 7) @ torch.ones(7, 2)
    assert y.shape == (5, 2) and c.detect_fake_mode([y]) is mode
    assert c.new_fake_mode() is not mode


def test_free_unbacked_symbols():
    class NonZero(torch.nn.Module):
        def forward(self, x):
            return x.nonzero()

    ep = torch.export.export(NonZero(), (torch.tensor([0.0, 1.0, 2.0]),))
    nz = next(n for n in ep.graph.nodes if n.target is aten.nonzero.default)
    assert len(c.free_unbacked_symbols(nz.meta["val"])) == 1
    assert not c.free_unbacked_symbols(_placeholder_vals(ep)[0])
    assert not c.free_unbacked_symbols(torch.ones(3))


def test_statically_known_true():
    _, _, ep = _exported(dynamic=True)
    batch = _placeholder_vals(ep)[-1].shape[0]
    assert isinstance(batch, torch.SymInt)
    assert c.statically_known_true(batch == batch) and c.statically_known_true(batch >= 1)
    assert not c.statically_known_true(batch == 5)  # possible, not known
    assert c.statically_known_true(batch <= 64) and not c.statically_known_true(batch >= 3)
    assert c.statically_known_true(True) and not c.statically_known_true(False)


# --- tracing and decomposition -----------------------------------------------------------------


def test_trace_with_decompositions():
    table = c.core_aten_decompositions()
    mode = c.new_fake_mode()
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    with mode:
        gm = c.trace_with_decompositions(lambda t: aten.hardsigmoid.default(t), table, mode.from_tensor(x))
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.hardsigmoid.default not in ops and ops, ops  # decomposed, to core ATen
    assert torch.allclose(gm(x), torch.nn.functional.hardsigmoid(x), atol=1e-6)


def test_core_aten_decompositions():
    from torch._decomp import _core_aten_decompositions_post_autograd  # the private builder, not the fallback

    table = c.core_aten_decompositions()
    assert set(table) == set(_core_aten_decompositions_post_autograd())
    assert aten.hardsigmoid.default in table
    x = torch.linspace(-4, 4, 17)
    assert torch.allclose(table[aten.hardsigmoid.default](x), torch.nn.functional.hardsigmoid(x))
    table.clear()
    assert c.core_aten_decompositions(), "each call returns a fresh dict"


def test_skip_graph_codegen():
    ctx = c.skip_graph_codegen()
    assert not isinstance(ctx, contextlib.nullcontext), "torch._use_lazy_graph_module is gone: the context is a no-op"
    with ctx:
        lazy = torch.fx.symbolic_trace(lambda t: t + 1)
    eager = torch.fx.symbolic_trace(lambda t: t + 1)
    assert type(lazy) is not type(eager) and isinstance(lazy, torch.fx.GraphModule)
    assert torch.equal(lazy(torch.ones(2)), torch.full((2,), 2.0))  # code made on first call


def test_preload_export_tracer():
    c.preload_export_tracer()
    assert callable(getattr(sys.modules["torch.export._trace"], "_export", None))


def _scaled(x):  # a helper outside forward: non-strict export records no frame of it by itself
    return torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest") * 3


class _CallsHelper(torch.nn.Module):
    def forward(self, x):
        return _scaled(x) + 1


def test_innermost_user_frames():
    from torch.fx.experimental.proxy_tensor import _ModuleStackTracer

    before = _ModuleStackTracer._filter_traceback_frames
    ctx = c.innermost_user_frames()
    assert not isinstance(ctx, contextlib.nullcontext), "_ModuleStackTracer._filter_traceback_frames is gone"
    with ctx:
        ep = torch.export.export(_CallsHelper(), (torch.ones(1, 2, 3, 3),), strict=False)
    assert _ModuleStackTracer._filter_traceback_frames is before, "the context restores torch's filter"
    traces = {n.target: n.meta.get("stack_trace") or "" for n in ep.graph.nodes if n.op == "call_function"}
    mul = next(t for op, t in traces.items() if "mul" in str(op))
    add = next(t for op, t in traces.items() if "add" in str(op))
    assert "in _scaled" in mul and "in forward" in mul, mul  # the helper's line after the forward that calls it
    assert "in _scaled" not in add, add


# --- torch.export errors --------------------------------------------------------------------------


def _export_user_error() -> BaseException:
    with pytest.raises(Exception) as info:
        torch.export.export(_Tiny(), (torch.ones(2, 4),), dynamic_shapes={"not_an_arg": {0: torch.export.Dim("b")}})
    return info.value


def test_is_export_user_error():
    assert c.is_export_user_error(_export_user_error())
    assert not c.is_export_user_error(ValueError("x")) and not c.is_export_user_error(TypeError("x"))


def test_is_dynamo_error():
    assert c.is_dynamo_error(_export_user_error())
    assert not c.is_dynamo_error(RuntimeError("x")) and not c.is_dynamo_error(KeyError("x"))


# --- .pt2 deserialization: a real archive written by torch.export.save ------------------------------


@pytest.fixture(scope="module")
def pt2(tmp_path_factory):
    model, x, ep = _exported()
    path = str(tmp_path_factory.mktemp("pt2") / "tiny.pt2")
    torch.export.save(ep, path)
    with zipfile.ZipFile(path) as zf:
        entries = {i.filename.split("/", 1)[1]: zf.read(i) for i in zf.infolist()}
    return model, x, ep, entries


def _weights(entries):
    raw = json.loads(entries["data/weights/model_weights_config.json"])
    config = c.payload_config(raw)
    out = {}
    for fqn, meta in config.config.items():
        lay = c.tensor_layout(meta.tensor_meta)
        flat = torch.frombuffer(bytearray(entries[f"data/weights/{meta.path_name}"]), dtype=lay.dtype)
        t = torch.as_strided(flat, lay.size, lay.stride, lay.storage_offset)
        out[fqn] = torch.nn.Parameter(t, requires_grad=False) if meta.is_param else t
    return config, out


def test_payload_config(pt2):
    model, _, _, entries = pt2
    config, _ = _weights(entries)
    assert set(config.config) == set(model.state_dict())
    assert {fqn for fqn, m in config.config.items() if m.is_param} == {"fc.weight", "fc.bias"}
    assert not any(m.use_pickle for m in config.config.values())


def test_tensor_layout(pt2):
    model, _, _, entries = pt2
    config, weights = _weights(entries)
    for fqn, want in model.state_dict().items():
        lay = c.tensor_layout(config.config[fqn].tensor_meta)
        assert (lay.dtype, lay.device, tuple(lay.size), tuple(lay.stride)) == (
            want.dtype, want.device, tuple(want.shape), want.stride())
        assert torch.equal(weights[fqn], want), fqn


def test_serde_sym_ops():
    ops = c.serde_sym_ops()
    assert {operator.add, operator.mul, operator.floordiv, torch.sym_max, torch.sym_min} <= ops
    assert not any(c.is_op_overload(op) for op in ops)


def test_deserialize_program(pt2):
    model, x, _, entries = pt2
    _, weights = _weights(entries)
    raw = json.loads(entries["models/model.json"])
    ep = c.deserialize_program(raw, weights, {})
    assert isinstance(ep, torch.export.ExportedProgram)
    x2 = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.allclose(ep.module()(x2), model(x2), atol=1e-6)


# --- pytree -------------------------------------------------------------------------------------

_TREE = ((torch.ones(1), [torch.zeros(2), 3]), {"b": torch.full((1,), 2.0), "a": None})


def test_tree_leaves():
    leaves = c.tree_leaves(_TREE)
    assert [type(v).__name__ for v in leaves] == ["Tensor", "Tensor", "int", "Tensor", "NoneType"]  # dict order kept
    assert leaves[3].item() == 2.0


def test_tree_flatten():
    leaves, spec = c.tree_flatten(_TREE)
    assert len(leaves) == spec.num_leaves == 5


def test_tree_unflatten():
    leaves, spec = c.tree_flatten(_TREE)
    back = c.tree_unflatten([v * 10 if isinstance(v, torch.Tensor) else v for v in leaves], spec)
    assert back[1]["a"] is None and back[0][1][1] == 3 and back[1]["b"].item() == 20.0


def test_tree_map():
    out = c.tree_map(lambda v: v + 1 if isinstance(v, torch.Tensor) else v, _TREE)
    assert out[0][0].item() == 2.0 and out[0][1][1] == 3 and out[1]["a"] is None


def test_tree_flatten_with_path():
    pairs, _ = c.tree_flatten_with_path({"logits": torch.ones(1), "cache": (torch.zeros(1), torch.zeros(2))})
    keys = ["_".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path) for path, _ in pairs]
    assert keys == ["logits", "cache_0", "cache_1"]


def test_treespec_dumps():
    _, spec = c.tree_flatten(_TREE)
    text = c.treespec_dumps(spec)
    assert isinstance(json.loads(text), (dict, list))


def test_treespec_loads():
    _, spec = c.tree_flatten(_TREE)
    assert c.treespec_loads(c.treespec_dumps(spec)) == spec
    _, _, ep = _exported()
    assert c.treespec_loads(c.treespec_dumps(ep.call_spec.in_spec)) == ep.call_spec.in_spec


# --- nn.Module internals --------------------------------------------------------------------------


def test_set_module_tensor():
    m = torch.nn.BatchNorm1d(3).eval()
    m.register_buffer("table", torch.zeros(3), persistent=False)
    w = torch.nn.Parameter(torch.full((3,), 2.0), requires_grad=False)
    c.set_module_tensor(m, "weight", w, True)
    c.set_module_tensor(m, "table", torch.ones(3), False)
    c.set_module_tensor(m, "running_var", torch.full((3,), 4.0), False)
    assert m.weight is w and dict(m.named_parameters())["weight"] is w
    assert m.table.sum().item() == 3.0 and "table" not in m.state_dict()  # still non-persistent
    x = torch.ones(2, 3)
    assert torch.allclose(m(x), (x - 0) / torch.sqrt(torch.tensor(4.0) + m.eps) * 2.0)


def test_module_owns_tensor():
    lin = torch.nn.Linear(2, 2, bias=False)  # bias: a parameter slot holding None
    lin.register_buffer("b", torch.ones(1))
    assert c.module_owns_tensor(lin, "weight") and c.module_owns_tensor(lin, "bias") and c.module_owns_tensor(lin, "b")
    assert not c.module_owns_tensor(lin, "forward") and not c.module_owns_tensor(lin, "x")
    assert not c.module_owns_tensor(torch.nn.Sequential(lin), "0")


def test_module_children():
    seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(1, 1))
    seq.register_module("gap", None)
    kids = c.module_children(seq)
    assert list(kids) == ["0", "1", "gap"] and kids["gap"] is None and kids["1"] is seq[1]
    kids["2"] = torch.nn.Tanh()  # the live table
    assert isinstance(getattr(seq, "2"), torch.nn.Tanh)


def test_replace_module_children():
    seq = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(2, 2))
    dup = copy.copy(seq)
    c.replace_module_children(dup, {k: copy.copy(v) for k, v in c.module_children(seq).items()})
    dup[0].training = False
    assert seq[0].training and not dup[0].training
    assert dup[1].weight is seq[1].weight  # the copy shares the parameters
    assert [n for n, _ in dup.named_children()] == ["0", "1"]


# --- the public replacements agree with the private names they replaced ----------------------------


def _aten_overloads():
    for n in c.registered_op_names():
        if n.startswith("aten::"):
            packet, _, ov = n[len("aten::"):].partition(".")
            # a backend loaded through torch's entry points (torch-tpu) can register an aten name with no
            # default overload: there is no OpOverload to compare for it
            op = getattr(getattr(aten, packet), ov or "default", None)
            if op is not None:
                yield op


def test_replaced_public_apis_agree_with_the_private_ones():
    ops = list(_aten_overloads())
    assert len(ops) > 1000
    for op in ops:
        assert op.name() == op._name
        assert (c.op_schema(op).overload_name or "default") == op._overloadname
    # the dispatch key by name ("CompositeImplicitAutograd") is no replacement: for an alias key the string
    # overload answers differently (False for aten._upsample_nearest_exact2d, which the enum says has one)
    assert torch.DispatchKey is torch._C.DispatchKey and "DispatchKey" in torch.__all__
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    pt2_dtypes = set(_SERIALIZE_TO_TORCH_DTYPE.values())  # every dtype a .pt2 tensor entry can have
    assert {torch.float32, torch.bfloat16, torch.int8, torch.bool, torch.complex64} <= pt2_dtypes
    for dtype in pt2_dtypes:
        assert dtype.itemsize == torch._utils._element_size(dtype), dtype
    shared = torch.nn.Linear(2, 2, bias=False)
    m = torch.nn.Module()
    m.a, m.b = shared, shared
    m.register_buffer("gone", None)
    m.register_buffer("buf", torch.ones(1))
    for mod in (m, shared):
        assert list(mod.named_parameters(recurse=False, remove_duplicate=False)) == [
            (k, v) for k, v in mod._parameters.items() if v is not None]
        assert list(mod.named_buffers(recurse=False, remove_duplicate=False)) == [
            (k, v) for k, v in mod._buffers.items() if v is not None]


# --- the docs page ------------------------------------------------------------------------------


def test_docs_page_is_current():
    with open(DOCS, encoding="utf-8") as f:
        assert f.read() == render(), "docs/torch_compat.md is stale: run `python -m tests.write_torch_compat_doc`"
    for u in c.USES:
        assert f"`{u.function}`" in render()
