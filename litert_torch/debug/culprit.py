"""find_culprits: bisect the captured graph for the smallest part that fails to convert or diverges.

The model is captured and decomposed as ``convert`` does; every node's value is computed once by running that
graph in torch (the reference). A segment of consecutive nodes is cut out as a module of its own (its outside
inputs become inputs, the weights it reads stay weights), converted to LiteRT and run on the interpreter with the
reference values; it fails when the conversion raises, the run raises, or an output differs from torch by more
than ``atol + rtol * |reference|``. The whole graph is checked first, then failing segments are halved until a
half no longer fails; a failure only two halves together show is narrowed from both ends instead.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import torch

__all__ = ["find_culprits", "Culprit"]


@dataclasses.dataclass
class Culprit:
    """The smallest failing part of a model: a module of its own, its inputs and what went wrong.

    Attributes:
        graph_module: The subgraph as a ``torch.fx.GraphModule`` (ATen ops), weights as buffers.
        inputs: Its inputs: the values torch computed for them on the user's arguments.
        ops: The ops in it (``"aten.tanh.default"``, ``"mylib.op.default"``).
        stack_traces: The user's source line of each op (``File "model.py", line 12, in forward: y = ...``).
        error: The conversion or run error (one line), or None when the outputs diverged.
        max_abs_diff: The largest difference from torch (None when it failed to convert or run).
    """

    graph_module: Any
    inputs: tuple
    ops: list[str]
    stack_traces: list[str]
    error: str | None = None
    max_abs_diff: float | None = None

    @property
    def reason(self) -> str:
        """Why it is a culprit, in one line."""
        if self.error is not None:
            return self.error
        return f"the converted outputs differ from torch by up to {self.max_abs_diff:.3g}"

    @property
    def code(self) -> str:
        """A runnable Python snippet: the subgraph as a module, sample inputs of the same shapes, and the
        ``convert`` call (custom ops need their library imported first)."""
        return _snippet(self)

    def print_code(self, print_output: bool = True) -> str:
        """Print (and return) :attr:`code`.

        Args:
            print_output: False: only return it.

        Returns:
            The snippet.
        """
        if print_output:
            print(self.code)
        return self.code

    def print_readable(self, print_output: bool = True) -> str:
        """Print (and return) the subgraph with its shapes (``GraphModule.print_readable``).

        Args:
            print_output: False: only return it.

        Returns:
            The readable graph.
        """
        return self.graph_module.print_readable(print_output=print_output)

    def __str__(self) -> str:
        lines = [f"culprit: {', '.join(self.ops)}: {self.reason}"]
        lines += [f"  at {s}" for s in dict.fromkeys(self.stack_traces)]
        return "\n".join(lines)


def find_culprits(torch_model: torch.nn.Module, args: tuple, max_granularity: int | None = None,
                  runtime_errors: bool = False, *, enable_fx_minifier_logging: bool = False,
                  kwargs: dict | None = None, atol: float | None = 1e-4, rtol: float = 1e-4) -> Iterator[Culprit]:
    """Find the smallest subgraphs of ``torch_model`` that fail to convert to LiteRT or convert to numbers that
    differ from torch.

    Args:
        torch_model: The module (called as ``torch_model(*args, **kwargs)``).
        args: Its sample positional inputs.
        max_granularity: Stop narrowing a failing part once it has at most this many ops (default: down to one).
        runtime_errors: Accepted for litert-torch 0.10's callers: errors raised running the converted part are
            always reported.
        enable_fx_minifier_logging: Print each checked part and its result.
        kwargs: Its sample keyword inputs.
        atol: The absolute tolerance on every output (None: report conversion and run errors only).
        rtol: The relative tolerance.

    Returns:
        An iterator of :class:`Culprit`, in graph order; empty when the whole model converts and matches.

    Raises:
        tpu_export.converter.ExportFailedError: ``torch.export`` cannot capture the model (nothing to bisect).

    Examples:
        >>> import torch
        >>> from tpu_export import litert_torch
        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        >>> list(litert_torch.debug.find_culprits(m, (torch.ones(1, 4),)))
        []
    """
    del runtime_errors  # always reported
    search = _Search(torch_model, tuple(args) if isinstance(args, (tuple, list)) else (args,), kwargs or {},
                     atol, rtol, print if enable_fx_minifier_logging else None)
    n = len(search.units)
    if n == 0 or search.check(0, n) is None:
        return
    limit = max(1, max_granularity or 1)
    for lo, hi in search.narrow(0, n, limit):
        yield search.culprit(lo, hi)


class _Search:
    def __init__(self, model, args, kwargs, atol, rtol, log):
        from tpu_export.converter._torch_compat import tree_leaves
        from tpu_export.converter.capture import capture
        from tpu_export.converter.decompositions import KEEP_WHOLE, decompose

        ep = capture(model, args, kwargs, strict="auto")
        ep = decompose(ep, KEEP_WHOLE, in_place=False)
        self.gm = ep.module()
        self.atol, self.rtol, self.log = atol, rtol, log
        flat = tree_leaves((args, kwargs))
        self.values = _run_recording(self.gm, flat)
        # a unit: an op and the getitems that unpack its results (never split apart)
        self.units: list[list] = []
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is operator.getitem and self.units and node.args[0] in self.units[-1]:
                self.units[-1].append(node)
            else:
                self.units.append([node])
        self._seen: dict = {}

    def nodes(self, lo, hi) -> list:
        return [n for u in self.units[lo:hi] for n in u]

    def check(self, lo, hi):
        """None when units[lo:hi] converts and matches; else (error, max_abs_diff)."""
        if (lo, hi) not in self._seen:
            gm, inputs, outs = _segment(self.gm, self.nodes(lo, hi), self.values)
            res = None if not outs else _convert_and_compare(gm, inputs, [self.values[o] for o in outs],
                                                             self.atol, self.rtol)
            if self.log:
                names = ", ".join(_op(n) for n in self.nodes(lo, hi))
                verdict = "ok" if res is None else res[0] or "diverges"
                self.log(f"find_culprits: ops {lo}..{hi - 1} ({names}): {verdict}")
            self._seen[(lo, hi)] = res
        return self._seen[(lo, hi)]

    def narrow(self, lo, hi, limit) -> list[tuple[int, int]]:
        if hi - lo <= limit:
            return [(lo, hi)]
        mid = (lo + hi) // 2
        found = []
        if self.check(lo, mid) is not None:
            found += self.narrow(lo, mid, limit)
        if self.check(mid, hi) is not None:
            found += self.narrow(mid, hi, limit)
        if found:
            return found
        # only the two halves together fail: drop ops from each end while it still fails
        while hi - lo > limit and self.check(lo + 1, hi) is not None:
            lo += 1
        while hi - lo > limit and self.check(lo, hi - 1) is not None:
            hi -= 1
        return [(lo, hi)]

    def culprit(self, lo, hi) -> Culprit:
        from tpu_export.converter.errors import source_line

        nodes = self.nodes(lo, hi)
        gm, inputs, _ = _segment(self.gm, nodes, self.values)
        error, diff = self.check(lo, hi)
        ops = [_op(n) for n in nodes if n.target is not operator.getitem]
        traces = [source_line(n) for n in nodes if n.target is not operator.getitem]
        return Culprit(gm, tuple(inputs), ops, traces, error, diff)


def _op(node) -> str:
    from tpu_export.converter.registry import op_name

    return op_name(node.target)


def _run_recording(gm, flat_args) -> dict:
    """Every node's value when ``gm`` runs on ``flat_args`` in torch."""
    import torch

    values: dict = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n] = out
            return out

    with torch.no_grad():
        Recorder(gm).run(*flat_args)
    return values


def _safe(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else f"_{s}"


def _segment(gm, nodes: list, values: dict):
    """``nodes`` as a GraphModule of their own: outside tensors -> inputs, weights -> buffers, the values read
    after the segment -> outputs. Returns (module, input values, the original nodes of its outputs)."""
    import torch

    inside = set(nodes)
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict = {}
    inputs: list = []

    def outside(a):
        if a in env:
            return env[a]
        v = values.get(a)
        if a.op == "get_attr":
            name = _safe(str(a.target))
            root.register_buffer(name, v.detach().clone())
            new = graph.get_attr(name)
        elif isinstance(v, torch.Tensor):
            new = graph.placeholder(_safe(a.name))
            inputs.append(v)
        else:
            return v  # a Python scalar (a size, a flag): a constant of the segment
        new.meta.update({k: a.meta[k] for k in ("val", "tensor_meta") if k in a.meta})
        env[a] = new
        return new

    for n in nodes:
        for a in n.all_input_nodes:
            if a not in inside:
                outside(a)
        env[n] = graph.node_copy(n, lambda a: env[a] if a in env else outside(a))
    outs = [n for n in nodes if isinstance(values.get(n), torch.Tensor)
            and any(u not in inside for u in n.users)]
    graph.output(tuple(env[n] for n in outs))
    seg = torch.fx.GraphModule(root, graph)
    return seg, inputs, outs


def _convert_and_compare(gm, inputs, refs, atol, rtol):
    import torch

    from tpu_export.litert_torch import convert

    try:
        model = convert(gm.eval(), tuple(inputs), strict_export=False)
    except Exception as e:  # noqa: BLE001 - the failure is what is being looked for
        return (f"conversion failed: {type(e).__name__}: {_one_line(e)}", None)
    try:
        out = model(*inputs)
    except Exception as e:  # noqa: BLE001 - the failure is what is being looked for
        return (f"the converted model failed to run: {type(e).__name__}: {_one_line(e)}", None)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if atol is None:
        return None
    worst, bad = 0.0, False
    for got, ref in zip(outs, refs):
        got = torch.as_tensor(got).detach().to(torch.float64)
        ref = ref.detach().to(torch.float64)
        if got.shape != ref.shape:
            return (f"the converted output has shape {tuple(got.shape)}, torch's {tuple(ref.shape)}", None)
        diff = (got - ref).abs()
        both_nan = torch.isnan(got) & torch.isnan(ref)
        diff = torch.where(both_nan, torch.zeros_like(diff), diff)
        if diff.numel():
            worst = max(worst, float(torch.nan_to_num(diff, nan=float("inf")).max()))
            bad = bad or bool((torch.nan_to_num(diff, nan=float("inf")) > atol + rtol * ref.abs()).any())
    return (None, worst) if bad else None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 400 else text[:400] + " ..."


def _tensor_expr(t) -> str:
    import torch

    shape = tuple(t.shape)
    dtype = str(t.dtype)
    if t.dtype.is_floating_point:
        return f"torch.randn({shape}, dtype={dtype})"
    if t.dtype == torch.bool:
        return f"torch.zeros({shape}, dtype=torch.bool)"
    return f"torch.zeros({shape}, dtype={dtype})"


def _snippet(c: Culprit) -> str:
    gm = c.graph_module
    from tpu_export.converter.errors import source_line

    where = {n.name: source_line(n) for n in gm.graph.nodes if n.op == "call_function" and n.meta.get("stack_trace")}
    body = []
    for line in gm.code.strip("\n").splitlines():
        m = re.match(r"\s+(\w+)\s*=", line)
        if m and m.group(1) in where:
            body.append(f"        # {where[m.group(1)]}")
        body.append(("    " + line).rstrip())
    buffers = [f"        self.register_buffer({name!r}, {_tensor_expr(b)})" for name, b in gm.named_buffers()]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = ", ".join(_tensor_expr(t) for t in c.inputs) + ("," if len(c.inputs) == 1 else "")
    namespaces = sorted({op.split(".")[0] for op in c.ops} - {"aten", "prims"})
    lines = [f"# {c.reason}"]
    lines += [f"#   at {s}" for s in dict.fromkeys(c.stack_traces)]
    if namespaces:
        lines.append(f"# import the library that defines the {', '.join(namespaces)} ops before running this")
    lines += ["import torch", "from torch import device  # noqa: F401 (the generated code may name devices)", "",
              "from tpu_export import litert_torch", "", "inf, nan = float('inf'), float('nan')", "", "",
              "class Culprit(torch.nn.Module):", "    def __init__(self):", "        super().__init__()"]
    lines += buffers
    lines.append("")
    lines += body
    lines += ["", "", f"inputs = ({inputs})  # random values of the failing part's input shapes "
              f"({len(placeholders)} inputs)",
              "model = Culprit().eval()",
              "converted = litert_torch.convert(model, inputs)",
              "print((converted(*inputs), model(*inputs)))"]
    return "\n".join(lines) + "\n"
