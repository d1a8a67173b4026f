"""Program signature -> a pure JAX function, by table dispatch over the fx graph's nodes."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import torch

from tpu_export.converter.program import Program, Signature
from tpu_export.converter.registry import LoweringError, bind_args
from tpu_export.converter.support import check_support, unsupported_ops

from . import all_ops  # noqa: F401  (fills JAX_LOWERINGS)
from .channels_last import channels_last_rewrite
from .context import Aval, LoweringContext, LoweringOptions, jnp_dtype
from .helpers import cast, is_array
from .registry import JAX_LOWERINGS, KERNEL_HOOKS
from .symbolic_dims import symbols_of_inputs

__all__ = ["LoweredSignature", "LoweringError", "lower_signature", "is_supported", "unsupported", "GraphRewrite",
           "PackedWeight"]


def is_supported(node: torch.fx.Node) -> bool:
    return node.op != "call_function" or JAX_LOWERINGS.is_supported(node)


def unsupported(prog: Program) -> dict[str, list[str]]:
    """op name -> user source lines of every node the TPU table cannot lower."""
    return unsupported_ops(prog, is_supported)


@dataclasses.dataclass
class _Step:
    node: torch.fx.Node
    fn: Callable
    args: list  # schema-ordered arguments; fx Nodes stand for values computed earlier


@dataclasses.dataclass
class PackedWeight:
    """A weight stored as several arrays (int8 values + per-channel scales), rebuilt inside the
    lowered function: ``unpack(*arrays)`` is what the rewritten users of the weight receive (or every user, where
    no rewrite claims them). ``like_weight``: the parts are computed in the dtype the weight itself would be
    (dtype="bfloat16" narrows them); otherwise in the dtype they are stored in."""

    parts: list  # [(stored name, torch.Tensor as stored)]
    unpack: Callable
    like_weight: bool = False
    # stored name -> perm: the part is the weight with its dims permuted (part dim i is the weight's dim perm[i])
    perms: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class GraphRewrite:
    """What a pre-pass over one signature changes (fused norm patterns, int8 linears).

    ``lowerings``: node -> (fn(ctx, *args), args), args holding fx Nodes for earlier values;
    ``skip``: nodes no lowering reads any more (folded into a rewritten node);
    ``packed_weights``: weight name -> PackedWeight;
    ``outputs``: output node -> fn(value) giving the value the signature returns (a laid-out value moved back
    to torch's layout)."""

    lowerings: dict = dataclasses.field(default_factory=dict)
    skip: set = dataclasses.field(default_factory=set)
    packed_weights: dict = dataclasses.field(default_factory=dict)
    outputs: dict = dataclasses.field(default_factory=dict)

    def update(self, other: "GraphRewrite") -> None:
        clash = (self.lowerings.keys() | self.skip) & (other.lowerings.keys() | other.skip)
        if clash or self.packed_weights.keys() & other.packed_weights.keys():
            raise LoweringError(f"two graph rewrites claim the same nodes {sorted(n.name for n in clash)}")
        self.lowerings.update(other.lowerings)
        self.skip |= other.skip
        self.packed_weights.update(other.packed_weights)
        self.outputs.update(other.outputs)


def _with_hook(hook, fallback):
    def lower(ctx, *args):
        out = hook(ctx, *args)
        return fallback(ctx, *args) if out is NotImplemented else out

    return lower


def lowering_of(node, options):
    fn = JAX_LOWERINGS.get(node.target)
    hook = KERNEL_HOOKS.get(node.target) if options.pallas is not None else None
    return _with_hook(hook, fn) if hook is not None else fn


_BF16_MAX = 3.3895313892515355e38


def _saturate_bf16(a):
    """Python floats beyond bf16's range (torch.finfo(float32).min as a mask value) saturate to
    bf16's largest finite value instead of becoming inf, so (1 - mask) * min stays 0, not NaN."""
    if isinstance(a, float) and abs(a) > _BF16_MAX and a not in (float("inf"), float("-inf")):
        return _BF16_MAX if a > 0 else -_BF16_MAX
    if isinstance(a, (list, tuple)):
        return type(a)(_saturate_bf16(x) for x in a)
    return a


def _substitute(a, env):
    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, tuple):
        return tuple(_substitute(x, env) for x in a)
    if isinstance(a, list):
        return [_substitute(x, env) for x in a]
    return a


def _avals(args) -> list:
    found = []

    def visit(a):
        if is_array(a):
            found.append(Aval(tuple(a.shape), a.dtype))
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)

    visit(args)
    return found


def _lower_and_cast(ctx, fn, *args):
    # one call through the table's error wrapper: a failing cast is reported like a failing lowering
    return _cast_result(fn(ctx, *args), ctx.node.meta.get("val"), ctx.options)


def _cast_result(out, val, options):
    if isinstance(val, torch.Tensor):
        if out is None:
            raise TypeError("the lowering returned None for a tensor output")
        return cast(out, jnp_dtype(val.dtype, options))
    if isinstance(val, (tuple, list)):
        return tuple(_cast_result(o, v, options) if o is not None else None for o, v in zip(out, val))
    return out  # SymInt / python number


@dataclasses.dataclass
class LoweredSignature:
    """One signature as a JAX function. ``fn(weights, *inputs)`` takes the weights in
    ``weight_names`` order and the inputs in ``signature.inputs`` order, and returns the outputs
    flat in ``signature.outputs`` order; it casts what it is given to ``weight_dtypes`` /
    ``input_dtypes`` (e.g. int64 ids to int32, f32 to bf16 under dtype="bfloat16")."""

    signature: Signature
    weight_names: list[str]
    options: LoweringOptions
    x64: bool  # callers must trace/run ``fn`` under ``jax.enable_x64(True)`` when set
    weight_dtypes: list  # jnp dtypes ``fn`` computes its weights in
    weight_shapes: list
    input_dtypes: list
    output_dtypes: list
    fn: Callable = dataclasses.field(repr=False)  # fn(weights: list, *inputs) -> list of outputs
    # Stored arrays that are not program weights (the parts of packed weights), by name.
    weight_values: dict = dataclasses.field(default_factory=dict, repr=False)
    # Stored arrays that are a program weight with its dims permuted: name -> (weight name, perm).
    weight_sources: dict = dataclasses.field(default_factory=dict, repr=False)

    def dim_constraints(self) -> list[str]:
        """jax.export constraints ("batch >= 2", "batch <= 64") from the signature's dim ranges."""
        used = {d for spec in self.signature.inputs for d in spec.shape if isinstance(d, str)}
        out = []
        for name, (lo, hi) in sorted(self.signature.dim_ranges.items()):
            if name not in used or not name.isidentifier():
                continue
            if lo > 1:
                out.append(f"{name} >= {lo}")
            if hi < 2**31 - 1:
                out.append(f"{name} <= {hi}")
        return out

    def weight_arrays(self, prog: Program) -> list:
        """The program's weights for this signature as numpy arrays in ``weight_dtypes``."""
        import numpy as np

        out = []
        for name, dt in zip(self.weight_names, self.weight_dtypes):
            w = (self.weight_values[name] if name in self.weight_values else prog.weights[name]).detach().cpu()
            if w.dtype == torch.bfloat16:
                w = w.float()
            out.append(np.asarray(w.numpy()).astype(dt))
        return out

    def abstract_args(self, scope=None) -> tuple[list, list]:
        """(weights, inputs) as ``jax.ShapeDtypeStruct``; dynamic dims become jax.export
        symbolic dims in one scope (equal names are equal dims) that carries torch's range
        for each dim (jax assumes >= 1 by itself), so e.g. ``x[-2:]`` on a dim known >= 2
        lowers, and calls outside the range are refused as torch would refuse them."""
        from jax import export

        if scope is None:
            scope = export.SymbolicScope(self.dim_constraints())
        ws = []
        for shape, dt in zip(self.weight_shapes, self.weight_dtypes):
            ws.append(jax.ShapeDtypeStruct(tuple(shape), dt))
        ins = []
        for spec, dt in zip(self.signature.inputs, self.input_dtypes):
            if spec.is_dynamic:
                shape = export.symbolic_shape(",".join(str(d) for d in spec.shape), scope=scope)
            else:
                shape = tuple(spec.shape)
            ins.append(jax.ShapeDtypeStruct(shape, dt))
        return ws, ins


def _steps(sig, rewrite, options) -> list:
    steps = [
        _Step(n, *rewrite.lowerings[n]) if n in rewrite.lowerings
        else _Step(n, lowering_of(n, options), bind_args(n))
        for n in sig.graph.nodes
        if n.op == "call_function" and n not in rewrite.skip
    ]
    if options.dtype == "bfloat16":
        for step in steps:
            step.args = _saturate_bf16(step.args)
    return steps


def lower_signature(
    prog: Program,
    signature_name: str | None = None,
    *,
    dtype: str | None = None,
    platforms=("tpu", "cpu"),
    use_pallas=False,
    generation: str | None = None,
    rewrites=(),
    precision: str = "highest",
) -> LoweredSignature:
    """Build the JAX function of one signature. Checks support of the whole program first, so
    every missing op is reported at once, before anything is written.

    ``use_pallas``: True / False / "auto" / a PallasConfig: kernel hooks and the spelled-out norm
    pre-pass (tpu_backend.pallas.hooks); ``generation`` picks the kernels' TPU block sizes.
    ``rewrites``: GraphRewrite objects for this signature (e.g. tpu_backend.quant's int8 linears).
    ``precision``: "highest" | "high" | "default": a float32 matmul's or conv's passes on TPU (context.PRECISIONS)."""
    check_support(prog, "tpu", is_supported)
    options = LoweringOptions(dtype=dtype, platforms=tuple(platforms), use_pallas=use_pallas,
                              x64=bool(prog.enable_x64), generation=generation, precision=precision)
    sig = prog.signature(signature_name)
    weight_nodes = sig.weight_nodes()
    input_nodes = sig.input_nodes()
    out_nodes = sig.output_nodes()
    rewrite = GraphRewrite()
    for r in rewrites:
        rewrite.update(r)
    if options.pallas is not None:
        from ..pallas.hooks import norm_pattern_rewrite  # importing it registers the kernel hooks

        rewrite.update(norm_pattern_rewrite(sig, options))
    steps = _steps(sig, rewrite, options)
    # The TPU's form, where it differs: convolution activations channels-last (channels_last.py). Exported for
    # several platforms, the signature is one platform_dependent over the two forms, and a TPU compile (after
    # platform_specialize) sees only its own.
    tpu_rewrite = channels_last_rewrite(sig, rewrite, options) if "tpu" in options.platforms else None
    tpu_steps = _steps(sig, tpu_rewrite, options) if tpu_rewrite is not None else None
    packed = [rewrite.packed_weights.get(w) for w in sig.weight_names]
    w_dtypes = [jnp_dtype(prog.weights[w].dtype, options) for w in sig.weight_names]
    # The flat weights argument: packed weights contribute their parts, stored dtypes kept.
    flat_names, flat_dtypes, flat_shapes, values, sources = [], [], [], {}, {}
    for w, p, dt in zip(sig.weight_names, packed, w_dtypes):
        parts = p.parts if p is not None else [(w, prog.weights[w])]
        for name, t in parts:
            flat_names.append(name)
            flat_dtypes.append(dt if p is None or p.like_weight else jnp_dtype(t.dtype))
            flat_shapes.append(tuple(t.shape))
            if p is not None:
                values[name] = t
                if name in p.perms:
                    sources[name] = (w, tuple(p.perms[name]))
    in_dtypes = [jnp_dtype(s.dtype, options) for s in sig.inputs]
    out_dtypes = [jnp_dtype(s.dtype, options) for s in sig.outputs]
    x64 = options.x64
    # a PT2E model's observed activations: rounded to their int8 grid where torch's converted model rounds them
    from ..quant import pt2e_activation_ranges

    ranges = pt2e_activation_ranges(sig)

    def run(steps, outputs, weights, *inputs):
        if len(weights) != len(flat_names) or len(inputs) != len(input_nodes):
            raise TypeError(
                f"signature {sig.name!r} takes {len(flat_names)} weights and {len(input_nodes)} inputs; "
                f"got {len(weights)} and {len(inputs)}"
            )
        env = {}
        arrays = iter(cast(jnp.asarray(w), dt) for w, dt in zip(weights, flat_dtypes))
        for node, p in zip(weight_nodes, packed):
            env[node] = next(arrays) if p is None else p.unpack(*[next(arrays) for _ in p.parts])
        for node, x, dt in zip(input_nodes, inputs, in_dtypes):
            env[node] = cast(jnp.asarray(x), dt)
        sym_env = symbols_of_inputs(input_nodes, [env[n] for n in input_nodes])
        for node in input_nodes:
            if node in ranges:
                env[node] = ranges[node](env[node])
        for step in steps:
            args = _substitute(step.args, env)
            ctx = LoweringContext(step.node, _avals(args), options, sym_env)
            env[step.node] = JAX_LOWERINGS.call(_lower_and_cast, ctx, (step.fn, *args))
            if step.node in ranges:
                env[step.node] = ranges[step.node](env[step.node])
        return [outputs[n](env[n]) if n in outputs else env[n] for n in out_nodes]

    body = default = functools.partial(run, steps, rewrite.outputs)
    if tpu_steps is not None:
        body = tpu = functools.partial(run, tpu_steps, tpu_rewrite.outputs)
        if tuple(options.platforms) != ("tpu",):
            body = lambda weights, *inputs: jax.lax.platform_dependent(weights, *inputs, tpu=tpu, default=default)

    def fn(weights, *inputs):
        if x64:
            with jax.enable_x64(True):
                return body(weights, *inputs)
        return body(weights, *inputs)

    return LoweredSignature(
        signature=sig,
        weight_names=flat_names,
        options=options,
        x64=x64,
        weight_dtypes=flat_dtypes,
        weight_shapes=flat_shapes,
        input_dtypes=in_dtypes,
        output_dtypes=out_dtypes,
        fn=fn,
        weight_values=values,
        weight_sources=sources,
    )

