"""No shipped file but converter/_torch_compat.py imports a private torch module or reads a private torch attribute.

Private: a leading underscore anywhere in the dotted path under torch, and ``torch.fx.experimental``; read
with ast (function-local imports, attribute chains rooted at torch or at a name bound to a torch path,
private attributes of torch objects on any value, getattr/hasattr with their names, module paths in strings).
The public names that start with an underscore (ATen operators named so) are listed explicitly.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = ("converter", "edge", "tpu_backend", "targets", "litert_torch", "tpu_export")
COMPAT = os.path.join("converter", "_torch_compat.py")

# Attribute names of torch objects (operators, modules, exported programs, fake tensors) that are private:
# read on anything but self/cls in shipped code, they must go through the compat module.
PRIVATE_TORCH_ATTRS = frozenset(
    "_schema _overloadname _opname _overloadpacket _name _op _handle _tags _parameters _buffers _modules "
    "_non_persistent_buffers_set _forward_hooks _forward_pre_hooks _state_dict_hooks _load_state_dict_pre_hooks "
    "_graph_module _graph_signature _constants _example_inputs _module_call_graph _verifiers _fake_mode "
    "_shape_env _code _codegen _in_spec _out_spec _spec _element_size _C _ops _guards _subclasses _decomp "
    "_dynamo _export _utils _pytree _trace _prims _refs _inductor _library _higher_order_ops _functorch".split()
)
# Public names under torch that start with an underscore: ATen operators whose own names do
# (torch.ops.aten._to_copy is the public handle of the operator named _to_copy).
ALLOWED_UNDERSCORE_OPS = frozenset(
    "_adaptive_avg_pool2d _adaptive_avg_pool3d _assert_tensor_metadata _cdist_forward _fft_c2c _fft_c2r _fft_r2c "
    "_local_scalar_dense _log_softmax "
    "_native_batch_norm_legit_no_training _prelu_kernel _softmax _to_copy _unsafe_view "
    "_upsample_nearest_exact1d _upsample_nearest_exact2d _upsample_nearest_exact3d".split()
)
_ATTR_CALLS = ("getattr", "hasattr", "setattr")
_PRIVATE_MODULE_TEXT = re.compile(r"torch(\.\w+)*\._[a-z]\w*(\.\w+)*")


def _is_private_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "torch" and (any(p.startswith("_") for p in parts[1:]) or name == "torch.fx.experimental"
                                    or name.startswith("torch.fx.experimental."))


def _chain(node):
    """['torch', 'ops', 'aten', '_to_copy'] for torch.ops.aten._to_copy; None unless rooted at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def private_torch_uses(rel: str, source: str) -> list[str]:
    tree = ast.parse(source)
    torch_names = {}  # local name -> the torch dotted path it stands for
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    torch_names[a.asname or "torch"] = a.name if a.asname else "torch"
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module and n.module.split(".")[0] == "torch":
            for a in n.names:
                torch_names[a.asname or a.name] = f"{n.module}.{a.name}"
        elif (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
              and (ch := _chain(n.value)) and ch[0] == "torch"):
            torch_names[n.targets[0].id] = ".".join(ch)  # aten = torch.ops.aten
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # not the whole chain
    found = []

    def bad(n, what):
        found.append(f"{rel}:{n.lineno}: {what}")

    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if _is_private_module(a.name):
                    bad(n, f"import {a.name}")
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module and n.module.split(".")[0] == "torch":
            for a in n.names:
                if _is_private_module(f"{n.module}.{a.name}"):
                    bad(n, f"from {n.module} import {a.name}")
        elif isinstance(n, ast.Attribute) and id(n) not in inner:
            ch = _chain(n)
            if ch and ch[0] in torch_names:  # a chain rooted at torch: every segment public
                path = torch_names[ch[0]].split(".") + ch[1:]
                for i, p in enumerate(path[1:], 1):
                    if p.startswith("_") and not p.endswith("__"):
                        if not (path[1] == "ops" and i == 3 and p in ALLOWED_UNDERSCORE_OPS):
                            bad(n, ".".join(path[:i + 1]))
                        break
                if ".".join(path).startswith("torch.fx.experimental"):
                    bad(n, ".".join(path))
                continue
            x = n
            while isinstance(x, ast.Attribute):  # any object: a private attribute of a torch object
                own = isinstance(x.value, ast.Name) and x.value.id in ("self", "cls")
                if x.attr in PRIVATE_TORCH_ATTRS and not own:
                    bad(x, f".{x.attr}")
                x = x.value
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _ATTR_CALLS
              and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and n.args[1].value in PRIVATE_TORCH_ATTRS):
            bad(n, f"{n.func.id}(..., {n.args[1].value!r})")
        elif (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant)  # m.__dict__["_modules"]
              and n.slice.value in PRIVATE_TORCH_ATTRS):
            bad(n, f"[{n.slice.value!r}]")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and _PRIVATE_MODULE_TEXT.fullmatch(n.value):
            bad(n, f"the string {n.value!r}")
    return sorted(set(found))


def _shipped_files():
    for folder in SHIPPED:
        for d, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in sorted(files):
                if f.endswith(".py"):
                    yield os.path.relpath(os.path.join(d, f), ROOT)


def test_no_private_torch_use_outside_the_compat_module():
    found = []
    files = list(_shipped_files())
    assert COMPAT in files and len(files) > 100
    for rel in files:
        if rel != COMPAT:
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                found += private_torch_uses(rel, f.read())
    assert not found, "private torch names outside converter/_torch_compat.py:\n" + "\n".join(found)


@pytest.mark.parametrize("snippet, what", [
    ("import torch._dynamo", "import torch._dynamo"),
    ("import torch.utils._pytree as pytree", "import torch.utils._pytree"),
    ("from torch._guards import detect_fake_mode", "from torch._guards import detect_fake_mode"),
    ("from torch.fx.experimental.symbolic_shapes import guard_or_false", "from torch.fx.experimental.symbolic_shapes"),
    ("from torch.utils import _pytree", "from torch.utils import _pytree"),
    ("import torch\nx = torch._C._dispatch_get_all_op_names()", "torch._C"),
    ("import torch\nx = torch.utils._pytree.tree_leaves(1)", "torch.utils._pytree"),
    ("import torch\nx = isinstance(1, torch._ops.OpOverload)", "torch._ops"),
    ("import torch\nx = torch.fx.experimental.proxy_tensor", "torch.fx.experimental"),
    ("import torch as t\nx = t._C", "torch._C"),
    ("import torch\nT = torch.ops.aten\nx = T._not_an_allowed_op", "torch.ops.aten._not_an_allowed_op"),
    ("def f(op):\n    return op._schema", "._schema"),
    ("def f(m):\n    return m._parameters", "._parameters"),
    ("def f(op):\n    return hasattr(op, '_overloadname')", "hasattr(..., '_overloadname')"),
    ("def f(m):\n    m.__dict__['_modules'] = {}", "['_modules']"),
    ("def f(e):\n    return type(e).__module__.startswith('torch._dynamo')", "the string 'torch._dynamo'"),
])
def test_the_static_check_catches(snippet, what):
    found = private_torch_uses("x.py", snippet)
    assert found and any(what in f for f in found), found


def test_the_static_check_allows_public_names():
    ok = ("import torch\naten = torch.ops.aten\n"
          "a = aten._to_copy.default\nb = torch.ops.aten._softmax.default\nc = torch.export.export\n"
          "d = torch.fx.Node\ne = torch.__version__\nclass K:\n    def f(self):\n        return self._name\n"
          "msg = 'use torch._check(...) to state the range'\n")
    assert private_torch_uses("x.py", ok) == []


def test_the_allowed_underscore_names_are_aten_operators():
    import torch

    for name in sorted(ALLOWED_UNDERSCORE_OPS):
        assert getattr(torch.ops.aten, name).overloads(), name

