"""Load a .pt2 (torch.export.save) without running anything from the file.

``torch.export.load`` is not safe on an untrusted file (torch 2.13), for four reasons found by
reading torch/export/pt2_archive/_package.py and torch/_export/serde/serialize.py:

- weights/constants whose config says ``use_pickle: true``, custom (``custom_obj_*``) and opaque
  (``opaque_obj_*``) constants, and the legacy ``data/weights/<model>.pt`` files are unpickled;
- ``data/sample_inputs/<model>.pt`` (a torch.save pickle in every archive) is loaded with
  ``weights_only=True`` and, when that fails, again with ``weights_only=False``;
- every symbolic-shape ``expr_str`` in ``models/<model>.json`` goes through ``sympy.sympify``,
  which evaluates it as Python (``__import__('os').system(...)`` runs);
- ``data/aotinductor/`` entries load a compiled shared library.

So this module reads the zip itself: it refuses every archive whose loading would unpickle or
run code (one line that says why and the fix), builds the weights from the raw tensor entries,
checks every shape expression against plain arithmetic and every node target against torch's
operator namespaces, and only then hands the JSON graph to torch's deserializer. The sample
inputs are never read (the converter takes its own sample inputs).
"""

from __future__ import annotations

import json
import os
import re
import zipfile

from ._torch_compat import (
    deserialize_program,
    payload_config,
    register_quantized_decomposed_ops,
    serde_sym_ops,
    tensor_layout,
)
from .errors import ExportFailedError, one_line
from .untrusted import UntrustedFileError, open_regular

__all__ = ["load_pt2"]

_MODEL = "model"  # torch.export.save writes one program, named "model"
_FIX = "Fix: save it with torch.export.save(torch.export.export(model, args), path), or pass the nn.Module"
_FIX_PICKLE = ("Fix: re-save it with torch.export.save from a model whose weights are plain torch.Tensors (no tensor "
               "subclasses or custom objects, which torch pickles), or pass the nn.Module")
_FIX_ALTERED = ("Fix: export the model again and save it with torch.export.save (torch never writes this; the file "
                "was altered or made by another tool), or pass the nn.Module")

# A shape expression is sympy's srepr, e.g. "Add(Symbol('s77', positive=True, integer=True),
# Integer(1))", and torch feeds it to sympy.sympify, which evaluates it as Python. It is accepted
# only if Python's own parser (which runs nothing) shows calls of sympy's arithmetic and logic
# classes and of the torch.utils._sympy.functions the deserializer puts in scope, numbers, and
# strings only as size-symbol names or number literals: no attributes, subscripts or other names.
_SYMBOL = re.compile(r"(s|u|zf|zuf|ps)\d+")
_NUMBER_TEXT = re.compile(r"-?\d+(\.\d*)?(e[+-]?\d+)?")
_EXPR_CALLS = frozenset(
    "Symbol Integer Rational Float Add Mul Pow Max Min Abs Mod floor ceiling sqrt Piecewise ITE "
    "Equality Unequality StrictLessThan LessThan StrictGreaterThan GreaterThan Eq Ne Lt Le Gt Ge And Or Not Xor "
    "FloorDiv ModularIndexing Where PythonMod CleanDiv CeilToInt FloorToInt CeilDiv LShift RShift PowByNatural "
    "FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator TruncToFloat TruncToInt RoundToInt "
    "RoundDecimal ToFloat Identity".split()
)
_EXPR_NAMES = frozenset("oo zoo nan true false".split())
_EXPR_KEYWORDS = frozenset(
    "positive negative nonnegative nonpositive integer real finite zero precision evaluate".split()
)
# sympy computes these eagerly: a power with a huge constant exponent never finishes
_POWERS = frozenset("Pow PowByNatural FloatPow LShift".split())
_MAX_INT = 2**63
_MAX_EXPR = 2000


def load_pt2(path: str):
    """The ExportedProgram in ``path``; nothing in the file is unpickled, evaluated or executed."""
    try:
        fd, _ = open_regular(path, what="the .pt2 archive")  # a FIFO or device is refused, never waited on
    except UntrustedFileError as e:
        raise ExportFailedError(str(e)) from None
    with os.fdopen(fd, "rb") as f:  # ZipFile leaves open a file object it was given
        try:
            zf = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise ExportFailedError(f"{path}: not a torch.export .pt2 archive ({_one_line(e)}). {_FIX}") from e
        with zf:
            try:
                files = _index(path, zf)
                weights = _tensors(path, zf, files, "data/weights/", "weight",
                                   f"data/weights/{_MODEL}_weights_config.json")
                constants = _tensors(path, zf, files, "data/constants/", "constant",
                                     f"data/constants/{_MODEL}_constants_config.json")
                raw = _json(path, zf, files, f"models/{_MODEL}.json")
            except ExportFailedError:
                raise
            except Exception as e:  # noqa: BLE001 - a corrupt entry: one line, never a traceback
                raise ExportFailedError(
                    f"{path}: not a readable torch.export .pt2 archive ({_one_line(e)}). {_FIX}") from e
    _register_ops(path, _check_graph_json(path, raw))
    return _deserialize(path, raw, weights, constants)


def _one_line(e: BaseException) -> str:
    text = one_line(e, 200)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _refuse(path: str, why: str, fix: str = _FIX_PICKLE) -> ExportFailedError:
    return ExportFailedError(f"{path}: refusing to load: {why}. {fix}")


def _index(path: str, zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """Entries by their name below the archive's root folder, after the archive-wide refusals."""
    infos = zf.infolist()
    if not infos:
        raise ExportFailedError(f"{path}: not a torch.export .pt2 archive (empty zip). {_FIX}")
    first = min(i.header_offset for i in infos)
    if first:  # the directory found is an inner archive's (the sample inputs): the file lost its end
        raise ExportFailedError(f"{path}: not a torch.export .pt2 archive (truncated or corrupt: the only zip "
                                f"directory left describes an archive starting at byte {first}). {_FIX}")
    for info in infos:
        if info.filename.endswith(".pkl"):
            raise _refuse(path, f"it holds a pickle ({info.filename}), as torch.save writes, and unpickling runs code "
                                "from the file; a torch.export .pt2 stores its graph as JSON", _FIX)
    root = infos[0].filename.split("/", 1)[0] + "/"
    files = {}
    for info in infos:
        if not info.filename.startswith(root):
            raise ExportFailedError(f"{path}: not a torch.export .pt2 archive ({info.filename} is outside the "
                                    f"archive's folder {root}). {_FIX}")
        files[info.filename[len(root):]] = info
    if "archive_version" not in files:
        if "serialized_exported_program.json" in files or "serialized_state_dict.pt" in files:
            raise _refuse(path, "it is the older torch.export archive format (serialized_*.pt entries), "
                                "whose weights are pickled")
        raise ExportFailedError(f"{path}: not a torch.export .pt2 archive (no archive_version). {_FIX}")
    version = zf.read(files["archive_version"]).decode(errors="replace").strip()
    if version != "0":
        raise ExportFailedError(f"{path}: .pt2 archive version {version[:20]!r} is not the one torch 2.13 writes "
                                f"('0'). {_FIX}")
    for name in files:
        if name.startswith("data/aotinductor/"):
            raise _refuse(path, f"it holds AOTInductor compiled code ({name}), which loading would run", _FIX)
    for legacy in (f"data/weights/{_MODEL}.pt", f"data/constants/{_MODEL}.pt"):
        if legacy in files:
            raise _refuse(path, f"its weights are in the legacy pickled form ({legacy})")
    if f"models/{_MODEL}.json" not in files:
        raise ExportFailedError(f"{path}: not a torch.export .pt2 archive (no models/{_MODEL}.json). {_FIX}")
    return files


def _json(path, zf, files, name):
    if name not in files:
        raise ExportFailedError(f"{path}: not a torch.export .pt2 archive (no {name}). {_FIX}")
    return json.loads(zf.read(files[name]).decode("utf-8"))


def _tensors(path, zf, files, folder, kind, config_name) -> dict:
    """Weights (or constants) from their raw entries, as torch's own _load_state_dict builds them."""
    import torch

    config = payload_config(_json(path, zf, files, config_name))
    storages: dict[str, torch.Tensor] = {}  # one flat tensor per entry: aliases share it, as in torch
    out = {}
    for fqn, meta in config.config.items():
        entry = meta.path_name
        if meta.use_pickle:
            raise _refuse(path, f"{kind} '{fqn}' ({folder}{entry}) is stored as a pickle (use_pickle: true; torch does "
                                "that for tensor subclasses), and unpickling runs code from the file")
        if kind == "constant" and entry.startswith(("custom_obj_", "opaque_obj_")):
            raise _refuse(path, f"constant '{fqn}' ({folder}{entry}) is a pickled custom object (ScriptObject or "
                                "opaque object), and unpickling runs code from the file")
        if kind == "constant" and not entry.startswith("tensor_"):
            raise ExportFailedError(f"{path}: corrupt .pt2: constant '{fqn}' has an unknown kind ({entry}). {_FIX}")
        tm = meta.tensor_meta
        if tm is None or "/" in entry or f"{folder}{entry}" not in files:
            raise ExportFailedError(f"{path}: corrupt .pt2: {kind} '{fqn}' has no tensor data "
                                    f"({folder}{entry}). {_FIX}")
        layout = tensor_layout(tm)
        dtype, device = layout.dtype, layout.device
        if entry not in storages:
            data = bytearray(zf.read(files[f"{folder}{entry}"]))
            if len(data) % dtype.itemsize:
                raise ExportFailedError(f"{path}: corrupt .pt2: {folder}{entry} holds {len(data)} bytes, not a whole "
                                        f"number of {dtype} elements. {_FIX}")
            # an empty entry stands for zeros of the meta's size, as torch's _build_file_map reads it
            flat = torch.frombuffer(data, dtype=dtype) if data else torch.zeros(layout.size, dtype=dtype)
            storages[entry] = flat if device.type == "cpu" else flat.to(device)
        t = torch.as_strided(storages[entry], layout.size, layout.stride, layout.storage_offset)
        out[fqn] = torch.nn.Parameter(t, requires_grad=tm.requires_grad) if meta.is_param else t
    return out


def _check_graph_json(path: str, raw) -> set[str]:
    """Refuse shape expressions that are not plain formulas and node targets outside torch's ops; return the
    torch operators the graph calls (``torch.ops.aten.add.Tensor``, ...)."""
    sym_ops = {f"{op.__module__}.{op.__name__}" for op in serde_sym_ops()} | {"_operator.getitem"}
    ops = set()
    stack = [raw]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                if k == "expr_str":
                    _check_expr(path, x)
                elif k == "target" and isinstance(x, str) and "inputs" in v:
                    if not (x.startswith("torch.ops.") and "__" not in x) and x not in sym_ops:
                        raise _refuse(path, f"graph node '{v.get('name')}' calls {x[:80]!r}, which is not a torch "
                                            "operator", _FIX_ALTERED)
                    if x.startswith("torch.ops."):
                        ops.add(x)
                else:
                    stack.append(x)
    if raw.get("guards_code"):
        # guards are Python source that ExportedProgram.module() would exec; the converter checks
        # shapes from range_constraints instead, so they are dropped rather than trusted
        raw["guards_code"] = []
    return ops


def _register_ops(path: str, ops: set[str]) -> None:
    """Register the operators that torch registers only when a module is imported, so a program saved from
    ``convert_pt2e``'s output loads in a fresh process; an operator nothing has registered is named with the
    import that would register it."""
    import torch

    if any(op.startswith("torch.ops.quantized_decomposed.") for op in ops):
        register_quantized_decomposed_ops()  # the quantize/dequantize ops PT2E quantization leaves
    for op in sorted(ops):
        parts = op.split(".")[2:]  # namespace, name, overload
        try:
            obj = torch.ops
            for part in parts:
                obj = getattr(obj, part)
        except (AttributeError, RuntimeError):
            hint = " (for torch.ops.torchao.*: `import torchao`)" if parts[0] == "torchao" else ""
            raise ExportFailedError(
                f"{path}: its graph calls {op}, which no imported library has registered. Fix: import the library "
                f"that defines it before converting{hint}, or pass the nn.Module") from None


def _check_expr(path: str, expr) -> None:
    import ast

    bad = None
    if not isinstance(expr, str) or len(expr) > _MAX_EXPR:
        bad = "not a short string"
    else:
        try:
            bad = _bad_expr_node(ast.parse(expr, mode="eval").body)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            bad = "text that is not an expression"
    if bad:
        raise _refuse(path, f"a shape expression in models/{_MODEL}.json ({str(expr)[:60]!r}) holds {bad}; torch "
                            "evaluates these as Python, so only sympy arithmetic on size symbols is accepted",
                      _FIX_ALTERED)


def _bad_expr_node(node):
    """What makes ``node`` unsafe to sympify, or None."""
    import ast

    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or (isinstance(v, (int, float)) and abs(v) <= _MAX_INT):
            return None
        return f"the constant {str(v)[:30]!r}"
    if isinstance(node, ast.Name):
        return None if node.id in _EXPR_NAMES or _SYMBOL.fullmatch(node.id) else f"the name {node.id!r}"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not, ast.Invert)):
        return _bad_expr_node(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv,
                                                            ast.Mod, ast.Pow)):
        if isinstance(node.op, ast.Pow) and not _small_exponent(node.right):
            return "a power with a large constant exponent"
        return _bad_expr_node(node.left) or _bad_expr_node(node.right)
    if isinstance(node, (ast.BoolOp, ast.Compare)):
        parts = node.values if isinstance(node, ast.BoolOp) else [node.left, *node.comparators]
        return next((b for b in map(_bad_expr_node, parts) if b), None)
    if isinstance(node, ast.Call):
        fn = node.func.id if isinstance(node.func, ast.Name) else None
        if fn not in _EXPR_CALLS:
            return f"a call of {ast.unparse(node.func)[:40]!r}"
        for kw in node.keywords:
            if (kw.arg not in _EXPR_KEYWORDS or not isinstance(kw.value, ast.Constant)
                    or isinstance(kw.value.value, str)):
                return f"the keyword {kw.arg!r}"
        if fn in _POWERS and len(node.args) == 2 and not _small_exponent(node.args[1]):
            return "a power with a large constant exponent"
        for a in node.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                ok = _SYMBOL.fullmatch(a.value) if fn == "Symbol" else (
                    fn in ("Integer", "Float", "Rational") and len(a.value) <= 20 and _NUMBER_TEXT.fullmatch(a.value))
                if not ok:
                    return f"the string {a.value[:30]!r}"
            elif (b := _bad_expr_node(a)):
                return b
        return None
    return f"Python syntax {type(node).__name__}"


def _small_exponent(node) -> bool:
    """An exponent sympy can evaluate at once: one that depends on a size symbol, or a constant <= 64."""
    import ast

    for n in ast.walk(node):
        name = n.value if isinstance(n, ast.Constant) else n.id if isinstance(n, ast.Name) else None
        if isinstance(name, str) and _SYMBOL.fullmatch(name):
            return True
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Integer" and len(node.args) == 1:
        node = node.args[0]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and abs(node.value) <= 64


def _deserialize(path, raw, weights, constants):
    try:
        # no sample inputs: torch would unpickle data/sample_inputs, which is never read here
        return deserialize_program(raw, weights, constants)
    except Exception as e:  # noqa: BLE001 - torch's deserializer errors are many kinds; one line for all
        raise ExportFailedError(f"{path}: not a readable torch.export .pt2 archive ({_one_line(e)}). {_FIX}") from e
