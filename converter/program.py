"""The Program both backends consume: core-ATen graphs, shared weights and signatures."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import torch

from ._torch_compat import tree_flatten, tree_flatten_with_path, tree_leaves, tree_unflatten
from .errors import ConversionError, UnsupportedOutputError, source_line
from .index_bounds import index_bounds

__all__ = ["TensorSpec", "Signature", "Program", "program_from_exported", "verify_program"]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The name, shape and dtype of one input or output of a signature.

    A dynamic dim is named by a string: the name of its ``torch.export.Dim`` (``"batch"``), or the symbol torch
    gave it where the name cannot be told. Its allowed range is in the signature's ``dim_ranges``.

    Attributes:
        name: The tensor's name (an input's parameter name; outputs are ``output_0``, ``output_1``, ... or the
            keys of a returned dict).
        shape: One entry per dim: an int, or a str for a dynamic dim.
        dtype: The tensor's torch dtype.
        index_bound: For integer ids that feed an embedding: every value must lie in ``[0, index_bound)`` (the
            runtimes check it, as torch does); None otherwise.

    Examples:
        >>> import torch
        >>> from tpu_export.converter import TensorSpec
        >>> spec = TensorSpec("x", ("batch", 4), torch.float32)
        >>> spec.is_dynamic
        True
    """

    name: str
    shape: tuple  # ints, and str names for dynamic dims (e.g. "batch")
    dtype: torch.dtype
    # ids that feed an embedding: every value must be in [0, index_bound), as torch checks
    index_bound: int | None = None

    @property
    def is_dynamic(self) -> bool:
        """Whether any dim is dynamic (named by a string)."""
        return any(isinstance(d, str) for d in self.shape)


@dataclasses.dataclass
class Signature:
    """One entry point of a Program: a core-ATen graph with its weights, inputs and outputs.

    ``graph_module``'s placeholders are the weights it reads (in the order of ``weight_names``), then the
    user inputs (in the order of ``inputs``). Both backends lower this graph; the signature's name is the
    name the converted model answers to (``model(x, signature_name=...)``).

    Attributes:
        name: The signature's name (``"serving_default"`` for a single-signature conversion).
        graph_module: The captured, decomposed graph.
        weight_names: The Program weights the graph reads, in placeholder order.
        inputs: The user inputs, flattened, in call order.
        outputs: The outputs, flattened.
        in_spec: The pytree spec of ``(args, kwargs)`` as the caller passes them.
        out_spec: The pytree spec of the output (a tensor, a tuple, a dict...).
        dim_ranges: Each dynamic dim's name -> its inclusive ``(min, max)``.

    Examples:
        >>> import torch
        >>> from tpu_export import converter
        >>> batch = torch.export.Dim("batch", min=1, max=8)
        >>> prog = converter.prepare(torch.nn.Linear(4, 2).eval(), (torch.ones(2, 4),),
        ...                          dynamic_shapes=({0: batch},))
        >>> sig = prog.signature()
        >>> sig.inputs[0].shape, sig.dim_ranges
        (('batch', 4), {'batch': (1, 8)})
        >>> sig.op_histogram()
        {'aten.linear.default': 1}
    """

    name: str
    graph_module: torch.fx.GraphModule
    weight_names: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    in_spec: Any  # pytree spec of (args, kwargs) as the user passes them
    out_spec: Any  # pytree spec of the output
    dim_ranges: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph

    def weight_nodes(self) -> list[torch.fx.Node]:
        return [n for n in self.graph.nodes if n.op == "placeholder" and "weight_name" in n.meta]

    def input_nodes(self) -> list[torch.fx.Node]:
        return [n for n in self.graph.nodes if n.op == "placeholder" and "weight_name" not in n.meta]

    def output_nodes(self) -> list:
        return list(tree_leaves(next(n for n in self.graph.nodes if n.op == "output").args[0]))

    def flatten_inputs(self, args: tuple = (), kwargs: dict | None = None) -> list:
        """The caller's positional and keyword arguments as the flat list of tensors in ``inputs`` order.

        Args:
            args: The positional arguments, as passed to the module.
            kwargs: The keyword arguments, as passed to the module.

        Returns:
            The input tensors, one per entry of ``inputs``.

        Raises:
            TypeError: The arguments do not match the signature's inputs.
        """
        flat, spec = tree_flatten((tuple(args), dict(kwargs or {})))
        if spec != self.in_spec and len(flat) != len(self.inputs):
            raise TypeError(
                f"signature {self.name!r} takes inputs {[i.name for i in self.inputs]}; got {len(flat)} values"
            )
        return flat

    def unflatten_outputs(self, flat: list):
        return tree_unflatten(list(flat), self.out_spec)

    def op_histogram(self) -> dict[str, int]:
        """How many times each op occurs in the graph.

        Returns:
            Op name (``"aten.linear.default"``) -> count.
        """
        from .registry import op_name

        hist: dict[str, int] = {}
        for n in self.graph.nodes:
            if n.op == "call_function":
                k = op_name(n.target)
                hist[k] = hist.get(k, 0) + 1
        return hist


@dataclasses.dataclass
class Program:
    """A captured model, as both backends take it: its signatures and the weights they share.

    ``converter.prepare`` (or ``prepare_many`` for several signatures) builds one; the edge backend lowers it to
    a ``.tflite`` and the TPU backend to StableHLO (``tpu_backend.export_program``). A weight used by several
    signatures is stored once.

    Attributes:
        weights: Weight name -> tensor, shared by every signature.
        signatures: Signature name -> Signature, in the order they were added.
        enable_x64: Whether 64-bit dtypes stay 64-bit (else int64 and float64 compute as 32-bit).

    Examples:
        >>> import torch
        >>> from tpu_export import converter
        >>> prog = converter.prepare(torch.nn.Linear(4, 2).eval(), (torch.ones(1, 4),))
        >>> sorted(prog.weights), list(prog.signatures)
        (['bias', 'weight'], ['serving_default'])
        >>> [(s.name, s.shape) for s in prog.signature().inputs]
        [('input', (1, 4))]
    """

    weights: dict[str, torch.Tensor]  # shared across signatures, each stored once
    signatures: dict[str, Signature]
    enable_x64: bool = False

    def signature(self, name: str | None = None) -> Signature:
        """One signature, by name.

        Args:
            name: The signature's name; None: the first signature.

        Returns:
            The Signature.

        Raises:
            KeyError: The program has no signature of that name (the message lists the ones it has).
        """
        if name is None:
            name = next(iter(self.signatures))
        try:
            return self.signatures[name]
        except KeyError:
            raise KeyError(f"no signature {name!r}; this program has {sorted(self.signatures)}") from None

    def fingerprint(self) -> str:
        """A hash of the program's graphs and weights (artifact manifests record it).

        Returns:
            The SHA-256 hex digest of every signature's graph and every weight's name, shape, dtype and bytes.
        """
        from .page_release import release_pages

        h = hashlib.sha256()
        for name, sig in sorted(self.signatures.items()):
            h.update(name.encode())
            h.update(str(sig.graph).encode())
        for name, w in sorted(self.weights.items()):
            h.update(name.encode())
            h.update(str((tuple(w.shape), w.dtype)).encode())
            # reshape(-1): a 0-d weight (a folded scalar) cannot be viewed as bytes directly; the
            # hash reads the weight's own memory (a view, no copy: a 2 GB model is hashed in place)
            flat = w.detach().contiguous().cpu().reshape(-1)
            if w.numel():
                h.update(memoryview(flat.view(torch.uint8).numpy()))
                # a weight mapped from a model directory was paged in by the hash: give those pages back (a
                # no-op for weights in memory; never for a page that was written)
                release_pages(w)
        return h.hexdigest()


# --------------------------------------------------------------------------- building


def _storage_key(t: torch.Tensor):
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _symbol_names(sig_inputs, args, kwargs, dynamic_shapes, forward_params) -> dict[str, str]:
    """Map torch's symbols (s0, s77) to the user's Dim names, where the spec makes it plain."""
    names: dict[str, str] = {}
    if dynamic_shapes is None:
        return names
    per_arg = []
    if isinstance(dynamic_shapes, dict):
        per_arg = [dynamic_shapes.get(p) for p in forward_params]
    else:
        per_arg = list(dynamic_shapes)
    values = list(args) + [kwargs[k] for k in kwargs]
    if len(values) != len(sig_inputs):
        return names  # nested inputs: keep torch's symbol names
    for node, spec in zip(sig_inputs, per_arg):
        if spec is None:
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        shape = node.meta["val"].shape
        for dim, d in items:
            n = getattr(d, "__name__", None)
            if d is not None and isinstance(n, str) and dim < len(shape) and isinstance(shape[dim], torch.SymInt):
                names[str(shape[dim].node.expr)] = n
    return names


def dim_of(d, sym_names: dict[str, str]):
    if isinstance(d, torch.SymInt):
        expr = str(d.node.expr)
        return sym_names.get(expr, expr)
    return int(d)


def _output_names(out_spec, n: int) -> list[str]:
    dummy = tree_unflatten(list(range(n)), out_spec)
    leaves = tree_flatten_with_path(dummy)[0]
    names = []
    top_is_dict = isinstance(dummy, dict)
    for path, _ in leaves:
        parts = []
        for k in path:
            parts.append(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))))
        if not parts:
            parts = ["0"]
        names.append("_".join(parts) if top_is_dict else "output_" + "_".join(parts))
    return names


def _strip_runtime_asserts(gm: torch.fx.GraphModule) -> None:
    # Shape/dtype asserts torch.export inserts are checked at capture; backends need none.
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and not n.users and "assert" in getattr(n.target, "__name__", ""):
            gm.graph.erase_node(n)
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and not n.users and str(n.target).startswith("aten.sym_constrain_range"):
            gm.graph.erase_node(n)


def program_from_exported(
    exported: dict[str, tuple[torch.export.ExportedProgram, dict]],
    *,
    enable_x64: bool = False,
) -> Program:
    """Build a Program from decomposed ExportedPrograms, one per signature.

    ``exported`` maps signature name -> (decomposed ExportedProgram, info) where info may hold
    'args', 'kwargs', 'dynamic_shapes', 'forward_params' for naming dynamic dims.
    Weights that are the same tensor (same storage) across signatures are stored once.
    """
    weights: dict[str, torch.Tensor] = {}
    by_storage: dict = {}
    signatures: dict[str, Signature] = {}
    from torch.export.graph_signature import InputKind, OutputKind

    for sig_name, (ep, info) in exported.items():
        gm = ep.graph_module
        gs = ep.graph_signature
        _strip_runtime_asserts(gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        weight_names, user_nodes = [], []
        for node, spec in zip(placeholders, gs.input_specs):
            if spec.kind == InputKind.USER_INPUT:
                user_nodes.append(node)
                continue
            if spec.kind == InputKind.TOKEN:
                raise ConversionError(f"signature {sig_name!r}: effect tokens are not supported")
            target = spec.target
            tensor = ep.state_dict[target] if target in ep.state_dict else ep.constants[target]
            if isinstance(tensor, torch.nn.Parameter):
                tensor = tensor.data
            if not isinstance(tensor, torch.Tensor):
                raise ConversionError(
                    f"signature {sig_name!r}: constant {target!r} is a {type(tensor).__name__}, not a tensor"
                )
            key = _storage_key(tensor)
            name = by_storage.get(key)
            if name is None:
                name = target
                if name in weights:  # a different tensor under the same name in another signature
                    name = f"{sig_name}.{target}"
                weights[name] = tensor
                by_storage[key] = name
            node.meta["weight_name"] = name
            weight_names.append(name)

        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        out_vals = list(out_node.args[0])
        user_out = []
        for val, spec in zip(out_vals, gs.output_specs):
            if spec.kind == OutputKind.USER_OUTPUT:
                user_out.append(val)
            elif spec.kind == OutputKind.BUFFER_MUTATION:
                raise ConversionError(
                    f"signature {sig_name!r}: the model mutates buffer {spec.target!r} in forward. "
                    "Fix: call module.eval() before converting, or return the new value instead of "
                    "assigning it to the buffer."
                )
            elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                # torch.export turns x.add_(...) on an input into an extra output that writes x back
                where = source_line(val) if isinstance(val, torch.fx.Node) else "<unknown source line>"
                raise ConversionError(
                    f"signature {sig_name!r}: forward modifies its input {spec.target!r} in place at {where}; "
                    "LiteRT and StableHLO programs cannot write to their inputs. Fix: work on a copy "
                    f"({spec.target} = {spec.target}.clone() first) or return the new value instead."
                )
            else:
                raise ConversionError(f"signature {sig_name!r}: unsupported output kind {spec.kind}")
        out_spec = ep.call_spec.out_spec
        names = _output_names(out_spec, len(user_out))
        for nm, val in zip(names, user_out):
            if not isinstance(val, torch.fx.Node) or not isinstance(val.meta.get("val"), torch.Tensor):
                raise UnsupportedOutputError(
                    f"signature {sig_name!r}: output {nm!r} is {val!r}, not a tensor. LiteRT and "
                    "StableHLO programs return tensors only. Fix: return tensors (wrap a Python "
                    "number in torch.tensor(...)) or drop it from the output."
                )
        out_node.args = (tuple(user_out),)

        sym_names = _symbol_names(
            user_nodes, info.get("args", ()), info.get("kwargs", {}) or {}, info.get("dynamic_shapes"),
            info.get("forward_params", []),
        )

        def spec_of(name, node, sym_names=sym_names):
            v = node.meta["val"]
            return TensorSpec(name, tuple(dim_of(d, sym_names) for d in v.shape), v.dtype)

        inputs = [dataclasses.replace(spec_of(n.name, n), index_bound=b)
                  for n, b in zip(user_nodes, index_bounds(user_nodes))]
        outputs = [spec_of(nm, v) for nm, v in zip(names, user_out)]
        ranges = {}
        for sym, rng in ep.range_constraints.items():
            if str(sym).startswith("u"):
                continue  # an unbacked size (computed from data, e.g. by .item()): no input dim to bound
            name = sym_names.get(str(sym), str(sym))
            hi = rng.upper
            ranges[name] = (int(rng.lower), int(hi) if hi.is_finite and hi < 2**31 else 2**31 - 1)
        gm.graph.lint()
        gm.recompile()
        signatures[sig_name] = Signature(
            name=sig_name,
            graph_module=gm,
            weight_names=weight_names,
            inputs=inputs,
            outputs=outputs,
            in_spec=ep.call_spec.in_spec,
            out_spec=out_spec,
            dim_ranges=ranges,
        )
    prog = Program(weights=weights, signatures=signatures, enable_x64=enable_x64)
    verify_program(prog, "build")
    return prog


def refresh_signature_specs(sig: Signature) -> None:
    """Recompute input/output dtypes and shapes from the graph (after a pass changed them)."""
    ins = sig.input_nodes()
    sig.inputs = [
        dataclasses.replace(spec, dtype=node.meta["val"].dtype) for spec, node in zip(sig.inputs, ins)
    ]
    outs = sig.output_nodes()
    sig.outputs = [
        TensorSpec(spec.name, spec.shape, node.meta["val"].dtype) for spec, node in zip(sig.outputs, outs)
    ]


class VerifierError(ConversionError):
    pass


def verify_program(prog: Program, stage: str) -> None:
    """Structural checks between stages: the graph is well formed, every node carries a fake
    value, placeholders are weights then inputs, and every weight exists exactly once."""
    for sig in prog.signatures.values():
        g = sig.graph
        try:
            g.lint()
        except Exception as e:  # noqa: BLE001
            raise VerifierError(f"after {stage}: signature {sig.name!r}: malformed graph: {e}") from e
        seen_input = False
        wn = []
        for n in g.nodes:
            if n.op == "placeholder":
                if "weight_name" in n.meta:
                    if seen_input:
                        raise VerifierError(f"after {stage}: weight placeholder {n.name} after a user input")
                    if n.meta["weight_name"] not in prog.weights:
                        raise VerifierError(f"after {stage}: weight {n.meta['weight_name']!r} missing")
                    wn.append(n.meta["weight_name"])
                else:
                    seen_input = True
            if n.op in ("placeholder", "call_function") and "val" not in n.meta:
                raise VerifierError(f"after {stage}: node {n.name} ({n.target}) has no meta['val']")
            if n.op in ("call_module", "get_attr"):
                raise VerifierError(f"after {stage}: node {n.name} is a {n.op}; expected a flat ATen graph")
        if wn != sig.weight_names:
            raise VerifierError(f"after {stage}: signature {sig.name!r} weight_names out of sync with graph")
        if len(sig.input_nodes()) != len(sig.inputs) or len(sig.output_nodes()) != len(sig.outputs):
            raise VerifierError(f"after {stage}: signature {sig.name!r} inputs/outputs out of sync with graph")
