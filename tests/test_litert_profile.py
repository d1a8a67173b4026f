"""The latency overlay from LiteRT's op profiler, on the real runtime: every op of the model gets a value, the
per-op times add up to the whole-model run, and a planted heavy op is the most expensive node."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch


class Planted(torch.nn.Module):
    """A few cheap element-wise ops around one big matmul (a 2048x2048 fully connected layer on 16 rows)."""

    def __init__(self):
        super().__init__()
        self.small = torch.nn.Linear(64, 2048)
        self.big = torch.nn.Linear(2048, 2048)
        self.head = torch.nn.Linear(2048, 8)

    def forward(self, x):
        y = torch.tanh(self.small(x * 0.5 + 1.0))
        return self.head(torch.relu(self.big(y)) - y)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from tpu_export import litert_torch

    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("prof") / "planted.tflite")
    litert_torch.convert(Planted().eval(), (torch.randn(16, 64),)).export(path)
    return path


def _ops(path):
    """(op name, first output tensor name, weight elements) of subgraph 0's ops, read from the flatbuffer."""
    from tpu_export.edge.builder import builtin_names
    from tpu_export.edge.inspect import read_model

    m = read_model(open(path, "rb").read())
    names = builtin_names()
    sg = m.subgraphs[0]
    out = []
    for op in sg.operators:
        code = m.operatorCodes[op.opcodeIndex]
        consts = [int(np.prod(sg.tensors[t].shape)) for t in op.inputs
                  if t >= 0 and m.buffers[sg.tensors[t].buffer].data is not None]
        out.append((names[max(code.builtinCode, code.deprecatedBuiltinCode)], sg.tensors[op.outputs[0]].name.decode(),
                    max(consts, default=0)))
    return out


def _builtin_invoke_us(path, x, repeats=30) -> float:
    """Median wall time of one invoke by the LiteRT interpreter with its builtin kernels (no XNNPACK), one thread:
    the same kernels the profiler times, run through a different API."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(model_path=path, num_threads=1,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    runner = interp.get_signature_runner()
    name = next(iter(runner.get_input_details()))
    runner(**{name: x})
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        runner(**{name: x})
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def test_profile_ties_every_event_to_a_model_op(planted):
    from tpu_export.explore.litert_profile import profile_ops

    prof = profile_ops(planted, min_time_s=0.3)
    ops = _ops(planted)
    assert [(o.subgraph, o.index) for o in prof.ops] == [(0, k) for k in range(len(ops))]
    assert [o.op for o in prof.ops] == [name for name, _, _ in ops]  # the tag LiteRT gave each event is the op's
    assert all(o.calls == 1 for o in prof.ops) and prof.runs >= 3
    # The ops run inside the profiled invoke: their sum is at most the invoke (whole microseconds each). How much of
    # the invoke they cover is checked against the interpreter in the next test: under the test suite's own load
    # the invoke's wall time also holds the waits between ops (0.4-0.5 of it covered by ops there, against 0.99
    # on an idle host), so a bound on it here would measure the host.
    total = prof.top_level_us()
    assert 0 < total <= prof.invoke_us + len(ops) and prof.invoke_us <= prof.run_us


def test_latency_overlay_sums_to_the_whole_model_and_finds_the_planted_op(planted):
    from tpu_export.explore import write_overlays
    from tpu_export.explore.overlays import PROFILER_SOURCE

    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    before = _builtin_invoke_us(planted, x)
    written = write_overlays(planted, names=["latency"])
    after = _builtin_invoke_us(planted, x)
    graph = json.load(open(written["latency"]))["serving_default"]
    assert graph["name"].endswith(f"{PROFILER_SOURCE})")
    res = graph["results"]
    ops = _ops(planted)
    assert set(res) == {key for _, key, _ in ops}  # a value for every op node, and no other key
    assert all(np.isfinite(v["value"]) and v["value"] >= 0 for v in res.values())
    heaviest = max(res, key=lambda k: res[k]["value"])
    big = max(ops, key=lambda o: o[2])  # the op holding the 2048x2048 weight
    assert big[0] == "FULLY_CONNECTED" and big[2] == 2048 * 2048
    assert heaviest == big[1]
    assert res[heaviest]["value"] > 0.5 * sum(v["value"] for v in res.values())
    # Independent reference: the interpreter's own invoke with the same builtin kernels, timed just before and just
    # after the profile (unloaded they agree within a few percent; under the test suite's own load on 2 cores a
    # shared CPU drifts, so the tolerance is 40%: a profile missing the heavy op would sum to under half).
    total = sum(v["value"] for v in res.values())
    assert 0.6 * min(before, after) <= total <= 1.4 * max(before, after), (total, before, after)


def test_the_op_alone_fallback_finds_the_same_planted_op(planted):
    # the source the overlay falls back to where the profiler cannot run: each op alone in a one-op model (XNNPACK)
    from tpu_export.explore.overlays import OP_ALONE_SOURCE, _op_alone_latency

    graph = _op_alone_latency(planted, repeats=5)["latency"]["serving_default"]
    assert graph["name"].endswith(f"{OP_ALONE_SOURCE})")
    res = graph["results"]
    big = max(_ops(planted), key=lambda o: o[2])
    assert set(res) == {key for _, key, _ in _ops(planted)}
    assert max(res, key=lambda k: res[k]["value"]) == big[1]


def _while_model(steps=3, n=256, rows=64) -> bytes:
    """main: WHILE(i < steps) { i += 1; x = tanh(x @ w) } then y = 2 * x, its loop in subgraphs cond and body."""
    from tpu_export.edge.builder import ModelBuilder, options, schema

    ops = schema().BuiltinOperator
    m = ModelBuilder()
    main, cond, body = m.subgraph("main"), m.subgraph("cond"), m.subgraph("body")
    x = main.tensor("x", (rows, n), np.float32)
    i_out, x_out = main.tensor("loop_i", (), np.int32), main.tensor("loop_x", (rows, n), np.float32)
    main.op(ops.WHILE, [main.const(np.array(0, np.int32), "i0"), x], [i_out, x_out],
            options("While", condSubgraphIndex=1, bodySubgraphIndex=2))
    y = main.tensor("y", (rows, n), np.float32)
    main.op(ops.MUL, [x_out, main.const(np.array(2, np.float32), "two")], [y], options("Mul"))
    main.inputs, main.outputs = [x], [y]
    ci, cx, go = cond.tensor("i", (), np.int32), cond.tensor("x", (rows, n), np.float32), cond.tensor("go", (), bool)
    cond.op(ops.LESS, [ci, cond.const(np.array(steps, np.int32), "steps")], [go])
    cond.inputs, cond.outputs = [ci, cx], [go]
    bi, bx = body.tensor("i", (), np.int32), body.tensor("x", (rows, n), np.float32)
    bi_next, fc, bx_next = (body.tensor("i_next", (), np.int32), body.tensor("fc", (rows, n), np.float32),
                            body.tensor("x_next", (rows, n), np.float32))
    w = (np.random.default_rng(0).standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    body.op(ops.ADD, [bi, body.const(np.array(1, np.int32), "one")], [bi_next], options("Add"))
    body.op(ops.FULLY_CONNECTED, [bx, body.const(w, "w"), -1], [fc], options("FullyConnected"))
    body.op(ops.TANH, [fc], [bx_next])
    body.inputs, body.outputs = [bi, bx], [bi_next, bx_next]
    m.add_signature("serving_default", 0, [("x", x)], [("y", y)])
    return m.finish()


def test_a_loop_body_is_profiled_per_iteration(tmp_path):
    from tpu_export.explore import write_overlays
    from tpu_export.explore.litert_profile import profile_ops

    path = str(tmp_path / "loop.tflite")
    open(path, "wb").write(_while_model())
    prof = profile_ops(path, min_time_s=0.2)
    by = {(o.subgraph, o.index): o for o in prof.ops}
    assert {k: (o.op, o.calls) for k, o in by.items()} == {
        (0, 0): ("WHILE", 1), (0, 1): ("MUL", 1), (1, 0): ("LESS", 4), (2, 0): ("ADD", 3),
        (2, 1): ("FULLY_CONNECTED", 3), (2, 2): ("TANH", 3)}
    # the WHILE op's time holds its cond and body runs; the signature's own ops add up within its invoke
    assert by[0, 0].us >= sum(o.us for o in prof.ops if o.subgraph > 0)
    assert prof.top_level_us() <= prof.invoke_us + 2
    data = json.load(open(write_overlays(path, names=["latency"])["latency"]))
    assert {g: set(d["results"]) for g, d in data.items()} == {
        "main": {"loop_i", "y"}, "cond": {"go"}, "body": {"i_next", "fc", "x_next"}}


def test_inputs_are_checked_by_name(planted):
    from tpu_export.explore.litert_profile import profile_ops

    with pytest.raises(ValueError, match="'y' is not an input of signature"):
        profile_ops(planted, inputs={"y": np.zeros((16, 64), np.float32)})
    with pytest.raises(ValueError, match="signature='nope'"):
        profile_ops(planted, signature="nope")
    with pytest.raises(ValueError, match=r"inputs\['x'\]: 512 bytes of float32, the compiled model's buffer holds"):
        profile_ops(planted, inputs={"x": np.zeros((2, 64), np.float32)})
    x = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    assert len(profile_ops(planted, inputs={"x": x}, min_time_s=0.05).ops) == len(_ops(planted))
