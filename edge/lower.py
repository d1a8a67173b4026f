"""The driver: walk a Signature's graph and emit one LiteRT subgraph.

``Lowerer`` is the context every lowering receives (converter.registry's contract: ``node``,
``out_dtype(s)`` as numpy dtypes, ``out_shape(s)`` with None for dynamic dims): it
materializes values in the layout an op asks for (constants permuted at conversion time,
TRANSPOSE/RESHAPE inserted lazily and cached per value), and emits operators.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from tpu_export.converter._torch_compat import is_op_overload, tree_map
from tpu_export.converter.passes.fold_constants import NEVER_FOLD, fold_fits
from tpu_export.converter.registry import LoweringContextBase, bind_args, unbind_args

from ..converter import layout as L
from .builder import ModelBuilder, options, schema
from .registry import EDGE
from .values import SymVal, Val, np_dtype

__all__ = ["Lowerer", "lower_signature", "SYM_OPS", "sym_binary"]

aten = torch.ops.aten

# Python operators torch.export writes on SymInts (dynamic shapes)
SYM_OPS = {
    operator.mul, operator.add, operator.sub, operator.floordiv, operator.mod, operator.neg,
    aten.sym_size.int, torch.sym_int, torch.sym_max, torch.sym_min,
}
_SYM_BINARY = {operator.mul: "MUL", operator.add: "ADD", operator.sub: "SUB", operator.floordiv: "FLOOR_DIV",
               operator.mod: "FLOOR_MOD"}
# builtins whose version 1 is not a builtin kernel (BROADCAST_TO v1 was the Flex op)
_MIN_VERSION = {"BROADCAST_TO": 2}


def _shape_of(val) -> tuple:
    return tuple(None if isinstance(d, torch.SymInt) and not _static(d) else int(d) for d in val.shape)


def _static(d) -> bool:
    try:
        return d.node.expr.is_number
    except AttributeError:
        return True


class Lowerer(LoweringContextBase):
    def __init__(self, model: ModelBuilder, prog, sig):
        self.model = model
        self.prog = prog
        self.sig = sig
        self.sg = model.subgraph(sig.name)
        self.node = None
        self._tmp = 0
        self.symbols: dict = {}  # sympy symbol of a dynamic input dim -> its SymVal ("dim", input, d)
        self._dims: dict = {}  # (tensor, physical dim) -> int32 [1] tensor of that dim's run-time size
        self._derived: set = set()  # symbols solved from a derived input dim ((dim - b) // a)
        # what a lowering emits once per signature and reuses for every node that asks (a grouped-query mask,
        # tiled once for all the layers reading it; a tensor's RESHAPE to a static shape): key -> value
        self.memo: dict = {}
        # (QParams, Val) of the values a PT2E model observed (converter/passes/pt2e_qdq.py): edge/quantize_pt2e.py
        # makes their ops int8 once the signature is lowered
        self.pt2e_values: list = []
        self.pt2e_requant: set = set()  # tensors of the RESHAPEs that requantize a value (see _pt2e_copy)

    # ------------------------------------------------------------------ current node
    def _dtype(self, torch_dtype) -> np.dtype:
        return np_dtype(torch_dtype)

    def _shape(self, val) -> tuple:
        return _shape_of(val)

    # ------------------------------------------------------------------ symbolic sizes
    def dim(self, v: Val, d: int):
        """Logical dim ``d`` of v: an int when static, else a SymVal read from v at run time."""
        n = v.shape[d]
        return n if n is not None else SymVal(None, ("dim", v, d))

    def dims(self, v: Val) -> list:
        return [self.dim(v, d) for d in range(v.rank)]

    def learn_symbol(self, expr, v: Val, d: int) -> None:
        """Input dim ``d`` of v has size ``expr``: a symbol (Dim("seq")) is that dim; a derived dim a*s + b
        (2 * Dim("half"), 16 * Dim("hq")) gives s = (dim - b) // a."""
        if expr is None or expr.is_number:
            return
        self.symbols.setdefault(expr, SymVal(None, ("dim", v, d)))  # 16*hq itself: read the dim, no arithmetic
        if expr.is_Symbol:
            self.symbols.setdefault(expr, SymVal(None, ("dim", v, d)))
            return
        free = list(expr.free_symbols)
        if len(free) != 1 or free[0] in self.symbols:
            return
        s = free[0]
        a, b = expr.diff(s), expr.subs(s, 0)
        if not (a.is_Integer and b.is_Integer and int(a) > 0 and (expr - a * s - b).expand() == 0):
            return
        n = sym_binary(operator.sub, SymVal(None, ("dim", v, d)), int(b))
        self.symbols[s] = sym_binary(operator.floordiv, n, int(a)) if int(a) != 1 else n
        self._derived.add(s)  # a computed value with a dim of exactly s replaces this arithmetic

    def note_dims(self, v: Val, fake) -> None:
        """A computed value's dynamic dims: a later size with the same expression (interpolate to a feature map's
        size) reads it from v's shape (SHAPE + GATHER, known when the interpreter prepares) instead of
        recomputing it with FLOOR_DIV / MUL from the inputs."""
        if not isinstance(fake, torch.Tensor) or fake.dim() != v.rank:
            return
        for d, size in enumerate(fake.shape):
            expr = getattr(getattr(size, "node", None), "expr", None)
            if v.shape[d] is None and expr is not None and (not expr.is_Symbol or expr in self._derived):
                if expr in self._derived:
                    self._derived.discard(expr)
                    self.symbols[expr] = SymVal(None, ("dim", v, d))
                else:
                    self.symbols.setdefault(expr, SymVal(None, ("dim", v, d)))

    def sym(self, d):
        """A torch size (int or SymInt) as an int, or a SymVal computed from the inputs' dims."""
        if isinstance(d, int) or _static(d):
            return int(d)
        return self._from_sympy(d.node.expr)

    @property
    def out_dims(self) -> list:
        """The first output's shape: ints, and SymVals for dynamic dims."""
        return [self.sym(d) for d in self._outs()[0].shape]

    def _from_sympy(self, e):
        import sympy

        if e.is_Integer:
            return int(e)
        if e in self.symbols:
            return self.symbols[e]
        kind = type(e).__name__
        ops = {"Add": operator.add, "Mul": operator.mul, "FloorDiv": operator.floordiv, "Mod": operator.mod,
               "PythonMod": operator.mod, "Max": "MAXIMUM", "Min": "MINIMUM"}
        if kind in ops and len(e.args) >= 2:
            parts = [self._from_sympy(a) for a in e.args]
            acc = parts[0]
            for p in parts[1:]:
                acc = sym_binary(ops[kind], acc, p)
            return acc
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            base, acc = self._from_sympy(e.base), None
            for _ in range(int(e.exp)):
                acc = base if acc is None else sym_binary(operator.mul, acc, base)
            return acc
        raise NotImplementedError(f"edge: the size {e} has no run-time form (supported: +, *, //, %, min, max of "
                                  f"the inputs' dynamic dims)")

    def sym_scalar(self, s, dtype=np.int32) -> int:
        """A 0-d tensor of ``dtype`` holding symbolic int ``s`` (an int: a constant)."""
        if isinstance(s, int) or (isinstance(s, SymVal) and s.value is not None):
            return self.const_tensor(np.array(s if isinstance(s, int) else s.value, dtype))
        t = self.reshape_tensor(self.sym_tensor(s), (), np.int32)
        if np.dtype(dtype) != np.int32:
            (t,), _ = self.emit("CAST", [t], [()], [dtype], suffix="cast")
        return t

    def name(self, suffix: str = "") -> str:
        base = self.node.meta.get("tensor_name", self.node.name) if self.node is not None else "t"
        if suffix:
            self._tmp += 1
            return f"{base};{suffix}{self._tmp}"
        return base

    # ------------------------------------------------------------------ values
    def const(self, array, dtype=None) -> Val:
        a = np.asarray(array, dtype=dtype)
        return Val(tuple(a.shape), a.dtype, L.identity(a.ndim), const=a)

    def const_tensor(self, array, dtype=None, name=None) -> int:
        a = np.asarray(array, dtype=dtype)
        if not a.flags.c_contiguous:
            a = a.copy()  # (np.ascontiguousarray would turn a 0-d scalar into shape [1])
        return self.sg.const(a, name or self.name("const"))

    def tensor(self, v: Val, perm=None) -> int:
        """v's tensor in layout ``perm`` (default: its own), emitting what is needed once."""
        perm = tuple(v.perm if perm is None else perm)
        if v.is_const:
            if perm not in v.layouts:
                data = np.transpose(v.const, perm) if v.const.ndim > 1 else v.const
                v.layouts[perm] = self.const_tensor(data.astype(v.dtype, copy=False), name=self._const_name(v))
            return v.layouts[perm]
        if perm == tuple(v.perm):
            return v.tensor
        if perm not in v.layouts:
            out_shape = v.phys_shape(perm)
            if None not in out_shape and out_shape == v.phys_shape() and L.same_data_order(v.perm, perm, v.shape):
                # only size-1 dims trade places and the physical shape is the same: the tensor itself (a RoPE
                # table unsqueezed per layer asked for a RESHAPE to its own shape, twice per layer)
                t = v.tensor
            elif L.same_data_order(v.perm, perm, v.shape) and sum(d is None for d in out_shape) <= 1:
                shape = self.const_tensor([-1 if d is None else d for d in out_shape], np.int32)
                (t,), _ = self.emit("RESHAPE", [v.tensor, shape], [out_shape], [v.dtype], suffix="reshape")
            else:
                t = self._transpose(v, L.transpose_perm(v.perm, perm), out_shape)
            v.layouts[perm] = t
        return v.layouts[perm]

    def _transpose(self, v: Val, tperm, out_shape) -> int:
        """TRANSPOSE v's tensor by ``tperm``. A batched swap [N, a, b] -> [N, b, a] with a 2
        among a, b runs as three transposes, [N, ab] -> [ab, N] -> [b, a, N] -> [N, ba]:
        XNNPACK's transpose is slow when a dim of 2 goes innermost (ShuffleNet's channel shuffle
        measured 1.06 us direct vs 0.44 us in three steps at N=64, b=16; 2.3 vs 1.9 ms at
        N=3136, b=58), while each of the three moves whole rows."""
        shape, cperm = L.canonical_transpose(v.phys_shape(), tperm)
        if cperm == (0, 2, 1) and None not in shape and shape[0] >= 16 and min(shape[1:]) == 2:
            n, a, b = shape
            t = self.reshape_tensor(v.tensor, (n, a * b), v.dtype)
            for shp, p in (((a * b, n), (1, 0)), ((b, a, n), (1, 0, 2)), ((n, b * a), (1, 0))):
                t = self.reshape_tensor(t, tuple(shp[i] for i in L.inverse(p)), v.dtype)
                (t,), _ = self.emit("TRANSPOSE", [t, self.const_tensor(p, np.int32)], [shp], [v.dtype],
                                    suffix="transpose", version=_transpose_version(len(p), v.dtype))
            return self.reshape_tensor(t, out_shape, v.dtype)
        tp = self.const_tensor(tperm, np.int32)
        (t,), _ = self.emit("TRANSPOSE", [v.tensor, tp], [out_shape], [v.dtype], suffix="transpose",
                            version=_transpose_version(len(tperm), v.dtype))
        return t

    def reshape_tensor(self, t: int, shape, dtype) -> int:
        """Tensor ``t`` as static ``shape`` (no op when it has that shape already)."""
        if tuple(self.sg.tensors[t].shape) == tuple(shape):
            return t
        (t,), _ = self.emit("RESHAPE", [t, self.const_tensor(list(shape), np.int32)], [tuple(shape)], [dtype],
                            suffix="reshape")
        return t

    def _const_name(self, v):
        return v.name or self.name("const")

    def with_perm(self, v: Val, perm) -> Val:
        perm = tuple(perm)
        if perm == tuple(v.perm):
            return v
        if v.is_const:
            return Val(v.shape, v.dtype, perm, const=v.const, layouts=v.layouts)
        return Val(v.shape, v.dtype, perm, tensor=self.tensor(v, perm))

    def alias(self, v: Val) -> Val:
        """The same value under another node (clone, detach, ...): fusion may see through it
        only when this alias is the source's one reader."""
        return Val(v.shape, v.dtype, v.perm, tensor=v.tensor, const=v.const,
                   producer=v.producer if v.users == 1 else None, layouts=v.layouts)

    # ------------------------------------------------------------------ ops
    def emit(self, op: str, inputs, out_shapes, out_dtypes, opts=None, version=1, suffix=None):
        """Write builtin ``op``; returns (output tensor indices, the OperatorT)."""
        outs = []
        for k, (shape, dtype) in enumerate(zip(out_shapes, out_dtypes)):
            nm = self.name(suffix) if suffix else (self.name() if k == 0 else self.name(f"out{k}_"))
            outs.append(self.sg.tensor(nm, shape, dtype))
        code = getattr(schema().BuiltinOperator, op)
        version = max(version, _MIN_VERSION.get(op, 1))
        o = self.sg.op(code, [-1 if i is None else i for i in inputs], outs, opts, version)
        return outs, o

    def op(self, op: str, inputs, shape, dtype, perm=None, opts=None, version=1, suffix=None,
           fusable=False) -> Val:
        """One-output op producing a value with logical ``shape`` in layout ``perm``."""
        perm = L.identity(len(shape)) if perm is None else tuple(perm)
        dtype = np.dtype(dtype)
        (t,), o = self.emit(op, inputs, [tuple(shape[p] for p in perm)], [dtype], opts, version, suffix)
        return Val(tuple(shape), dtype, perm, tensor=t, producer=o if fusable else None)

    def options(self, kind, **fields):
        return options(kind, **fields)

    def fuse_activation(self, x: Val, act: int) -> Val | None:
        """Fold an activation into x's producer (CONV_2D, FULLY_CONNECTED, ADD, ...) when x has
        no other reader. Returns the activated value, or None when it cannot."""
        o = x.producer
        if o is None or x.users != 1 or x.is_const or x.layouts:
            return None
        opts = o.builtinOptions
        if getattr(opts, "fusedActivationFunction", None) != 0:
            return None
        opts.fusedActivationFunction = act
        return Val(x.shape, x.dtype, x.perm, tensor=x.tensor)

    def cast(self, v: Val, dtype) -> Val:
        dtype = np.dtype(dtype)
        if v.dtype == dtype:
            return v
        if v.is_const:
            return self.const(v.const.astype(dtype))
        return self.op("CAST", [v.tensor], v.shape, dtype, v.perm, suffix="cast")

    def reshape(self, v: Val, new_shape) -> Val:
        """v viewed as logical ``new_shape`` (ints; None or a SymVal for dynamic dims)."""
        new_shape = list(new_shape)
        if v.is_const and all(isinstance(d, int) for d in new_shape):
            return self.const(v.const.reshape(new_shape))
        logical = tuple(d if isinstance(d, int) else None for d in new_shape)
        if logical == tuple(v.shape) and all(d is not None for d in logical):
            return v
        src, out_perm = L.plan_reshape(v.shape, v.perm, logical)
        t = self.tensor(v, src)
        phys = [new_shape[p] for p in out_perm]
        if all(isinstance(d, int) for d in phys):
            # the same physical shape needs no op; the same reshape of the same tensor is written once (each
            # decoder layer unsqueezes the shared RoPE cos/sin: one RESHAPE each for all the layers)
            src_t = self.sg.tensors[t]
            if src_t.shapeSignature is None and tuple(phys) == tuple(src_t.shape):
                return Val(logical, v.dtype, out_perm, tensor=t)
            key = ("reshape", t, tuple(phys))
            if key not in self.memo:
                self.memo[key] = self.op("RESHAPE", [t, self.shape_tensor(phys)], logical, v.dtype, out_perm).tensor
            return Val(logical, v.dtype, out_perm, tensor=self.memo[key])
        shape_t = self.shape_tensor(phys)
        return self.op("RESHAPE", [t, shape_t], logical, v.dtype, out_perm)

    def shape_tensor(self, dims, infer=True) -> int:
        """An int32 shape operand: a constant (with ``infer``, one unknown dim written -1, as
        RESHAPE takes it) or, otherwise, computed at run time from SHAPE."""
        dims = [d.value if isinstance(d, SymVal) and d.value is not None else d for d in dims]
        unknown = [d for d in dims if not isinstance(d, int)]
        if not unknown or (infer and len(unknown) == 1):
            return self.const_tensor([d if isinstance(d, int) else -1 for d in dims], np.int32)
        parts = [self.sym_tensor(d) if not isinstance(d, int) else self.const_tensor([d], np.int32) for d in dims]
        (t,), _ = self.emit("CONCATENATION", parts, [(len(dims),)], [np.int32], self.options("Concatenation", axis=0),
                            suffix="shape")
        return t

    def sym_tensor(self, s) -> int:
        """An int32 [1] tensor holding symbolic int ``s`` at run time."""
        if s is None:
            raise NotImplementedError("edge: a shape with several dynamic dims whose run-time sizes this lowering "
                                      "does not compute (pass SymVals: Lowerer.dims / out_dims)")
        if isinstance(s, int):
            return self.const_tensor([s], np.int32)
        if s.value is not None:
            return self.const_tensor([s.value], np.int32)
        if s.tensor is None:
            kind = s.expr[0]
            if kind == "dim":
                v, d = s.expr[1], s.expr[2]
                key = (self.tensor(v), v.perm.index(d))
                if key not in self._dims:
                    (shp,), _ = self.emit("SHAPE", [key[0]], [(v.rank,)], [np.int32],
                                          self.options("Shape", outType=2), suffix="shape")
                    idx = self.const_tensor([key[1]], np.int32)
                    (self._dims[key],), _ = self.emit("GATHER", [shp, idx], [(1,)], [np.int32],
                                                      self.options("Gather", axis=0), suffix="dim")
                t = self._dims[key]
            elif kind is operator.neg:
                (t,), _ = self.emit("NEG", [self.sym_tensor(s.expr[1])], [(1,)], [np.int32], suffix="sym")
            else:
                a, b = self.sym_tensor(s.expr[1]), self.sym_tensor(s.expr[2])
                (t,), _ = self.emit(_SYM_BINARY.get(kind, kind), [a, b], [(1,)], [np.int32], suffix="sym")
            s.tensor = t
        return s.tensor


def sym_binary(op, a, b):
    """``op`` (a Python operator, or "MAXIMUM" / "MINIMUM") on ints and SymVals: an int when both are known."""
    av = a if isinstance(a, int) else a.value
    bv = b if isinstance(b, int) else b.value
    if av is not None and bv is not None:
        fn = {"MAXIMUM": max, "MINIMUM": min}.get(op, op)
        return int(fn(av, bv))
    if op is operator.mul and (av == 1 or bv == 1):
        return b if av == 1 else a
    if op is operator.add and (av == 0 or bv == 0):
        return b if av == 0 else a
    if (op is operator.sub and bv == 0) or (op is operator.floordiv and bv == 1):
        return a
    return SymVal(None, (op, a, b))


def _transpose_version(rank, dtype) -> int:
    if rank > 5:
        return 6
    if rank > 4:
        return 5 if np.dtype(dtype) == np.bool_ else 4
    return 3 if np.dtype(dtype) == np.bool_ else 1


# ---------------------------------------------------------------------------- driver


def _weight_val(prog, node) -> Val:
    w = prog.weights[node.meta["weight_name"]]
    w = w.detach()
    if w.dtype == torch.bfloat16:
        w = w.float()
    a = w.contiguous().numpy()
    return Val(tuple(a.shape), a.dtype, L.identity(a.ndim), const=a, name=node.meta["weight_name"])


def _sym_value(lw, node, args) -> SymVal:
    val = node.meta.get("val")
    known = int(val) if isinstance(val, int) or (isinstance(val, torch.SymInt) and _static(val)) else None
    if node.target is aten.sym_size.int:
        v, d = args
        d = d % v.rank
        return SymVal(v.shape[d] if v.shape[d] is not None else known, ("dim", v, d))
    if node.target is operator.neg:
        return SymVal(known, (operator.neg, args[0]))
    if node.target in _SYM_BINARY:
        return SymVal(known, (node.target, args[0], args[1]))
    if known is None:
        return lw.sym(val)  # sym_max, sym_min, ...: rebuilt from the inputs' dims
    return SymVal(known)


def _leaves(x) -> list:
    """The values inside nested lists, tuples and dicts (torch's pytree costs ~10x more here, and
    this runs for every node)."""
    if isinstance(x, (list, tuple)):
        return [v for y in x for v in _leaves(y)]
    if isinstance(x, dict):
        return [v for y in x.values() for v in _leaves(y)]
    return [x]


def _try_fold(lw, node, args):
    """Evaluate a node whose inputs are all constants, when the result stays small."""
    if not is_op_overload(node.target) or any(k in node.target.name() for k in NEVER_FOLD):
        return None
    leaves = _leaves(args)
    if any(isinstance(a, SymVal) for a in leaves):
        return None
    ins = [a for a in leaves if isinstance(a, Val)]
    if not all(a.is_const for a in ins):
        return None
    outs = node.meta["val"]
    outs_t = outs if isinstance(outs, (tuple, list)) else (outs,)
    if not all(isinstance(o, torch.Tensor) for o in outs_t):
        return None
    if any(not all(d is not None for d in _shape_of(o)) for o in outs_t):
        return None
    if not fold_fits(sum(o.numel() * o.element_size() for o in outs_t), sum(a.const.nbytes for a in ins)):
        return None
    from tpu_export.converter.interpret import call_narrowed

    targs, tkw = tree_map(
        lambda a: torch.from_numpy(np.array(a.const)) if isinstance(a, Val) else a, unbind_args(node.target, args))
    try:
        with torch.no_grad():
            res = call_narrowed(node.target, targs, tkw)
    except Exception:  # noqa: BLE001 - lower it instead
        return None
    res_t = res if isinstance(res, (tuple, list)) else (res,)
    vals = tuple(lw.const(r.detach().to(o.dtype).numpy() if o.dtype != torch.bfloat16 else r.float().numpy())
                 for r, o in zip(res_t, outs_t))
    return vals if isinstance(res, (tuple, list)) else vals[0]


def _pt2e_copy(lw, v: Val) -> Val:
    """A RESHAPE of v to its own shape: the op edge.quantize_pt2e turns into an int8 -> int8 QUANTIZE."""
    phys = [-1 if d is None else d for d in v.phys_shape()]
    if phys.count(-1) > 1:
        raise NotImplementedError("edge: a PT2E value requantized to a second range with several dynamic dims")
    return lw.op("RESHAPE", [lw.tensor(v), lw.const_tensor(phys, np.int32)], v.shape, v.dtype, v.perm,
                 suffix="requant")


def _boundary_layout(index, channel_last, rank) -> tuple:
    return L.channel_last(rank) if index in set(channel_last) and rank >= 3 else L.identity(rank)


def lower_signature(model: ModelBuilder, prog, sig, *, channel_last_inputs=(), channel_last_outputs=()) -> Lowerer:
    """Emit ``sig`` as a new subgraph of ``model`` and add its signature def. The inputs and
    outputs at the given indices are written channel-last (N, spatial..., C)."""
    lw = Lowerer(model, prog, sig)
    env: dict = {}
    inputs = []
    for n in sig.graph.nodes:
        lw.node = n
        if n.op == "placeholder":
            if "weight_name" in n.meta:
                env[n] = _weight_val(prog, n)
                continue
            spec = sig.inputs[len(inputs)]
            shape = lw.out_shape
            dtype = np_dtype(n.meta["val"].dtype)
            perm = _boundary_layout(len(inputs), channel_last_inputs, len(shape))
            t = lw.sg.tensor(spec.name, [shape[p] for p in perm], dtype)
            inputs.append((spec.name, t))
            env[n] = Val(shape, dtype, perm, tensor=t)
            for d, size in enumerate(n.meta["val"].shape):
                lw.learn_symbol(getattr(getattr(size, "node", None), "expr", None), env[n], d)
        elif n.op == "call_function":
            args = torch.fx.node.map_arg(bind_args(n), lambda a: env[a])
            if n.target is operator.getitem:
                res = args[0][args[1]]
            elif n.target in SYM_OPS:
                res = _sym_value(lw, n, args)
            elif n.meta.get("pt2e_requant"):  # a PT2E value at a second range: a tensor of its own to requantize
                res = _pt2e_copy(lw, args[0])
            else:
                res = _try_fold(lw, n, args)
                if res is None:
                    res = EDGE.call(EDGE.get(n.target), lw, args)
            if isinstance(res, Val):
                res.users = len(n.users)
                if not res.static and not res.is_const:
                    lw.note_dims(res, n.meta.get("val"))
            env[n] = res
        elif n.op == "output":
            outs = []
            seen = {t for _, t in inputs}
            for k, (spec, o) in enumerate(zip(sig.outputs, sig.output_nodes())):
                v = env[o]
                perm = _boundary_layout(k, channel_last_outputs, v.rank)
                t = lw.tensor(v, perm)
                if v.is_const or t in seen:
                    # an output must be a tensor of its own, written by an op
                    phys = v.phys_shape(perm)
                    shp = lw.const_tensor([-1 if d is None else d for d in phys], np.int32)
                    (t,), _ = lw.emit("RESHAPE", [t, shp], [phys], [v.dtype], suffix="out")
                seen.add(t)
                lw.sg.rename(t, spec.name)
                outs.append((spec.name, t))
    lw.pt2e_values = [(n.meta["pt2e_qparams"], env[n]) for n in sig.graph.nodes
                      if "pt2e_qparams" in n.meta and isinstance(env.get(n), Val)]
    lw.pt2e_requant = {env[n].tensor for n in sig.graph.nodes if n.meta.get("pt2e_requant") and n in env}
    lw.sg.inputs = [t for _, t in inputs]
    lw.sg.outputs = [t for _, t in outs]
    # its own subgraph's index: a lowering may have added subgraphs after it (edge.attention_prefix)
    model.add_signature(sig.name, model.subgraphs.index(lw.sg), inputs, outs)
    return lw
