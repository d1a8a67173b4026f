"""A/B latency of two .tflite files of the same model in the LiteRT interpreter, and where each spends it.

    .venv/bin/python bench/onnx_latency_ab.py A.tflite B.tflite [--input x.npy] [--rounds 40] [--block 5]
                                              [--groups] [--no-xnnpack] [--fresh 3]
    .venv/bin/python bench/onnx_latency_ab.py --build efficientnet_b0,regnet_y_400mf --dir /tmp/ab [--groups]

Both files load in one process (1 thread, XNNPACK unless --no-xnnpack) and run in alternating blocks of --block
invokes, the order within each round drawn at random, so a burst of load on a shared host hits both; each
invoke's wall time (perf_counter) and CPU time (process_time: what a busy host does not inflate by preemption)
are kept; the report gives both medians and the B/A ratio of their medians, with the 10th-90th percentile of the
per-round ratios as its spread. --fresh N repeats the whole A/B in N fresh processes (weight packing, arena
placement and page layout then differ per run; the file loaded first alternates) and reports each and the median
ratio: on this host one process's ratio is off by up to +-5% while its per-round spread looks tight.

--groups: the time per op group, by knock-out. From each file, variants are written with groups of ops removed
cumulatively (their consumers rewired to the op's same-shaped input, ops left dead pruned): "se" (squeeze-excite
gates: a MUL by a broadcast 1x1 gate, and the MEAN -> CONV -> ... -> LOGISTIC branch computing it), "act" (the
remaining unfused elementwise activations: LOGISTIC * x (SiLU), RELU, RELU6, HARD_SWISH). What is left is the
convolution core (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, PAD, residual ADDs, the head's MEAN / RESHAPE). Each
group's time is the drop from the variant before it; the numbers are for timing only (the variants do not compute
the model).

--build: exports each model (bench/real_models.py sizes, TorchScript exporter at opset 17) and converts it with
ours and onnx2tf 2.6 (bench/onnx_vs_onnx2tf.py's workers, each in a fresh process) into --dir, then A/Bs the pair
(A = ours, B = onnx2tf).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

UNARY_ACTS = ("RELU", "RELU6", "HARD_SWISH", "RELU_N1_TO_1", "TANH")


class Runner:
    """One .tflite, inputs set once; ``block(n)`` runs n invokes and keeps (wall ms, cpu ms) of each."""

    def __init__(self, path: str, x=None, xnnpack: bool = True):
        import numpy as np
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        kw = {} if xnnpack else {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
        self.it = Interpreter(model_path=path, num_threads=1, **kw)
        self.it.allocate_tensors()
        for d in self.it.get_input_details():
            a = x if x is not None and tuple(x.shape) == tuple(d["shape"]) else None
            if a is None and x is not None and x.ndim == 4 and x.transpose(0, 2, 3, 1).shape == tuple(d["shape"]):
                a = x.transpose(0, 2, 3, 1)  # the NCHW image a .tflite with NHWC image inputs takes transposed
            if a is None:
                a = np.random.default_rng(0).standard_normal(d["shape"])
            self.it.set_tensor(d["index"], np.ascontiguousarray(a, dtype=d["dtype"]))
        for _ in range(3):
            self.it.invoke()
        self.wall, self.cpu = [], []

    def block(self, n: int):
        for _ in range(n):
            w, c = time.perf_counter(), time.process_time()
            self.it.invoke()
            self.cpu.append((time.process_time() - c) * 1e3)
            self.wall.append((time.perf_counter() - w) * 1e3)


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def ab(paths: dict, x=None, rounds: int = 40, block: int = 5, xnnpack: bool = True) -> dict:
    """{label: {wall_ms, cpu_ms}} medians, plus per-label ratio spreads vs the first label."""
    runners = {k: Runner(p, x, xnnpack) for k, p in paths.items()}
    per_round = {k: [] for k in runners}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(runners)
        rng.shuffle(order)
        for k in order:
            n0 = len(runners[k].cpu)
            runners[k].block(block)
            per_round[k].append((statistics.median(runners[k].wall[n0:]), statistics.median(runners[k].cpu[n0:])))
    base = next(iter(runners))
    out = {}
    for k, r in runners.items():
        out[k] = {"wall_ms": statistics.median(r.wall), "cpu_ms": statistics.median(r.cpu)}
        if k != base:
            ratios = [b[1] / a[1] for a, b in zip(per_round[base], per_round[k])]
            out[k].update(cpu_ratio=out[k]["cpu_ms"] / out[base]["cpu_ms"],
                          wall_ratio=out[k]["wall_ms"] / out[base]["wall_ms"],
                          cpu_ratio_p10=_pct(ratios, 0.1), cpu_ratio_p90=_pct(ratios, 0.9))
    return out


# --- knock-out variants -------------------------------------------------------------------------------------

def _names():
    from tpu_export.edge.builder import builtin_names

    return builtin_names()


def _op_kind(model, op, names):
    c = model.operatorCodes[op.opcodeIndex]
    return names[max(c.builtinCode, c.deprecatedBuiltinCode)]


def knock_out(model, groups) -> int:
    """Remove the ops of ``groups`` from subgraph 0 of ModelT ``model`` in place; returns how many went."""
    names = _names()
    sg = model.subgraphs[0]
    shape = lambda t: tuple(sg.tensors[t].shape)  # noqa: E731
    producer = {int(t): op for op in sg.operators for t in op.outputs}
    rewire = {}  # removed op's output -> the tensor its consumers read instead
    for op in sg.operators:
        k, ins, out = _op_kind(model, op, names), [int(t) for t in op.inputs], int(op.outputs[0])
        if k == "MUL" and len(ins) == 2:
            a, b = ins
            if "se" in groups and shape(a) != shape(b):  # x * broadcast gate: the gate's branch then dies
                rewire[out] = a if shape(a) == shape(out) else b
            elif "act" in groups and (b in producer and _op_kind(model, producer[b], names) == "LOGISTIC"
                                      and int(producer[b].inputs[0]) == a):
                rewire[out] = a  # SiLU: x * sigmoid(x); the LOGISTIC dies with it
            elif "act" in groups and (a in producer and _op_kind(model, producer[a], names) == "LOGISTIC"
                                      and int(producer[a].inputs[0]) == b):
                rewire[out] = b
        elif k in UNARY_ACTS and "act" in groups:
            rewire[out] = ins[0]

    def resolve(t):
        while t in rewire:
            t = rewire[t]
        return t

    kept = [op for op in sg.operators if int(op.outputs[0]) not in rewire]
    for op in kept:
        op.inputs = [resolve(int(t)) if t >= 0 else int(t) for t in op.inputs]
    sg.outputs = [resolve(int(t)) for t in sg.outputs]
    for sd in model.signatureDefs or []:
        for tm in sd.outputs:
            tm.tensorIndex = resolve(tm.tensorIndex)
    while True:  # prune ops nothing reads any more
        used = {int(t) for op in kept for t in op.inputs} | {int(t) for t in sg.outputs}
        alive = [op for op in kept if any(int(t) in used for t in op.outputs)]
        if len(alive) == len(kept):
            break
        kept = alive
    removed = len(sg.operators) - len(kept)
    sg.operators = kept
    return removed


def write_variant(src: str, dst: str, groups) -> int:
    import flatbuffers

    from tpu_export.edge.inspect import read_model

    with open(src, "rb") as f:
        model = read_model(f.read())
    removed = knock_out(model, groups)
    fb = flatbuffers.Builder(os.path.getsize(src) + (1 << 20))
    fb.Finish(model.Pack(fb), file_identifier=b"TFL3")
    with open(dst, "wb") as f:
        f.write(fb.Output())
    return removed


# residual ADDs are not knocked out: dropping one kills a branch (the block's convolutions with it)
def single_op_models(path: str):
    """(kind, bytes of a .tflite holding just that op) for each op of subgraph 0: its constant inputs kept, the
    others made graph inputs; only the buffers it reads are kept."""
    import copy

    import flatbuffers

    from tpu_export.edge.inspect import read_model

    with open(path, "rb") as f:
        model = read_model(f.read())
    names, sg = _names(), model.subgraphs[0]
    for op in sg.operators:
        m = copy.copy(model)
        m.signatureDefs, m.metadata = None, None
        tmap, tensors, buffers = {}, [], [model.buffers[0]]
        for t in [int(t) for t in op.inputs if t >= 0] + [int(t) for t in op.outputs]:
            if t not in tmap:
                tt = copy.copy(sg.tensors[t])
                b = model.buffers[tt.buffer] if tt.buffer else None
                if b is not None and b.data is not None and len(b.data):
                    buffers.append(b)
                    tt.buffer = len(buffers) - 1
                else:
                    tt.buffer = 0
                tmap[t] = len(tensors)
                tensors.append(tt)
        one = copy.copy(op)
        one.inputs = [tmap[int(t)] if t >= 0 else int(t) for t in op.inputs]
        one.outputs = [tmap[int(t)] for t in op.outputs]
        g = copy.copy(sg)
        g.tensors, g.operators = tensors, [one]
        g.inputs = [tmap[int(t)] for t in op.inputs if t >= 0 and not tensors[tmap[int(t)]].buffer]
        g.outputs = list(one.outputs)
        m.subgraphs, m.buffers = [g], buffers
        fb = flatbuffers.Builder(1 << 20)
        fb.Finish(m.Pack(fb), file_identifier=b"TFL3")
        yield _op_kind(model, op, names), bytes(fb.Output())


def per_kind(paths: dict, invokes: int = 60) -> dict:
    """{label: {op kind: cpu ms}}: each op alone in its own interpreter (XNNPACK, 1 thread), median CPU time of
    ``invokes`` calls, minus the median of an empty call (the interpreter's own cost), summed by kind. An op
    alone is timed with warm caches and without the fusions the whole graph gets (a PAD before a conv is fused
    into it there): shares, not the graph's total."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    def timed(content):
        it = Interpreter(model_content=content, num_threads=1)
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.ones(d["shape"], d["dtype"]))
        it.invoke()
        ts = []
        for _ in range(invokes):
            c = time.process_time()
            it.invoke()
            ts.append((time.process_time() - c) * 1e3)
        return statistics.median(ts)

    out = {}
    for label, p in paths.items():
        kinds = {}
        ops = list(single_op_models(p))
        base = min(timed(c) for k, c in ops if k == "RESHAPE") if any(k == "RESHAPE" for k, _ in ops) else 0.0
        for k, c in ops:
            kinds[k] = kinds.get(k, 0.0) + max(timed(c) - base, 0.0)
        out[label] = kinds
    return out


STEPS = [("full", ()), ("-se", ("se",)), ("-se-act", ("se", "act"))]


def group_breakdown(paths: dict, folder: str, x=None, rounds: int = 20, block: int = 5) -> dict:
    """{label: {step: cpu ms}} with every variant of every file timed in one alternating A/B. A step that
    removes nothing is not timed again (it takes the time before it: its group costs 0, not the noise)."""
    files, same_as = {}, {}
    for label, p in paths.items():
        prev, removed_before = f"{label}full", 0
        files[prev] = p
        for step, groups in STEPS[1:]:
            dst = os.path.join(folder, f"{os.path.basename(p)}{step}.tflite")
            removed = write_variant(p, dst, groups)
            if removed == removed_before:
                same_as[f"{label}{step}"] = prev
            else:
                files[f"{label}{step}"] = dst
                prev = f"{label}{step}"
            removed_before = removed
    res = ab(files, x, rounds, block)
    for k, v in same_as.items():
        res[k] = res[v]
    return {label: {step: res[f"{label}{step}"]["cpu_ms"] for step, _ in STEPS} for label in paths}


def print_breakdown(label, t):
    full = t["full"]
    parts = {"se gates": t["full"] - t["-se"], "activations": t["-se"] - t["-se-act"],
             "conv core + adds": t["-se-act"]}
    print(f"  {label:6s} total {full:8.2f} ms cpu: " + ", ".join(
        f"{k} {v:.2f} ms ({100 * v / full:.0f}%)" for k, v in parts.items()))


def build(models, folder):
    import numpy as np

    from bench.onnx_vs_onnx2tf import convert_in_subprocess, ensure_peer, export_onnx

    pairs = {}
    for name in models:
        onnx_path = os.path.join(folder, f"{name}.onnx")
        if not os.path.exists(onnx_path):
            np.save(os.path.join(folder, f"{name}.x.npy"), export_onnx(name, onnx_path, "torchscript17")["x"])
        for impl in ("ours", "peer"):
            out = os.path.join(folder, f"{name}.{impl}.tflite")
            if not os.path.exists(out):
                py = sys.executable if impl == "ours" else ensure_peer()
                r = convert_in_subprocess(py, impl, onnx_path, out)
                if "error" in r:
                    raise SystemExit(f"{name}: {impl} conversion failed: {r['error']}")
        pairs[name] = (os.path.join(folder, f"{name}.ours.tflite"), os.path.join(folder, f"{name}.peer.tflite"),
                       os.path.join(folder, f"{name}.x.npy"))
    return pairs


def load_avg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def fresh_ratios(a, b, x_path, n: int, rounds: int = 40, block: int = 5, verbose: bool = False) -> list:
    """A's / B's CPU ms per invoke, one ratio per fresh process (n of them).

    The in-process ratio is stable (tight per-round spread) but differs between processes by up to +-5% here
    (weights and arena land elsewhere in each): the figure is the median over fresh processes; and the file loaded
    first runs ~0.5-1.5% slower (an A/A of one file twice: 1.004-1.006), so the processes alternate which one loads
    first."""
    ratios = []
    for i in range(n):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        argv = [sys.executable, os.path.abspath(__file__), first, second, "--rounds", str(rounds),
                "--block", str(block), "--json"] + (["--input", x_path] if x_path else [])
        r = subprocess.run(argv, capture_output=True, text=True)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"fresh A/B run failed: {r.stderr.strip()[-300:]}")
        res = json.loads(lines[-1])
        ta, tb = (res["A"], res["B"]) if i % 2 == 0 else (res["B"], res["A"])
        ratios.append(ta["cpu_ms"] / tb["cpu_ms"])
        if verbose:
            print(f"  A {ta['cpu_ms']:.2f} ms cpu, B {tb['cpu_ms']:.2f} ({'A' if i % 2 == 0 else 'B'} loaded first): "
                  f"A/B {ratios[-1]:.3f}")
    return ratios


def run_pair(a, b, x_path, args):
    import numpy as np

    x = np.load(x_path) if x_path else None
    if args.fresh:
        ratios = fresh_ratios(a, b, x_path, args.fresh, args.rounds, args.block, verbose=True)
        print(f"  A/B cpu over {len(ratios)} fresh processes: median {statistics.median(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f}; load {load_avg()}")
        return
    res = ab({"A": a, "B": b}, x, args.rounds, args.block, not args.no_xnnpack)
    if args.json:
        print(json.dumps(res))
        return
    ra, rb = res["A"], res["B"]
    print(f"  A {ra['cpu_ms']:.2f} ms cpu / {ra['wall_ms']:.2f} wall; B {rb['cpu_ms']:.2f} / {rb['wall_ms']:.2f}; "
          f"A/B cpu {1 / rb['cpu_ratio']:.3f} (per-round p10-p90 {1 / rb['cpu_ratio_p90']:.3f}-"
          f"{1 / rb['cpu_ratio_p10']:.3f}), wall {1 / rb['wall_ratio']:.3f}; load {load_avg()}")
    if args.groups:
        folder = args.dir or os.path.dirname(os.path.abspath(a))
        t = group_breakdown({"A": a, "B": b}, folder, x, max(10, args.rounds // 2), args.block)
        for label in t:
            print_breakdown(label, t[label])
        print(f"  (load {load_avg()})")
    if args.ops:
        for label, kinds in per_kind({"A": a, "B": b}).items():
            total = sum(kinds.values())
            print(f"  {label} ops alone, sum {total:.2f} ms cpu: " + ", ".join(
                f"{k} {v:.2f} ({100 * v / total:.0f}%)" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
        print(f"  (load {load_avg()})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--input")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--groups", action="store_true")
    ap.add_argument("--ops", action="store_true", help="each op alone, CPU time summed by op kind")
    ap.add_argument("--no-xnnpack", action="store_true")
    ap.add_argument("--fresh", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--build")
    ap.add_argument("--dir")
    args = ap.parse_args()
    if args.build:
        os.makedirs(args.dir, exist_ok=True)
        for name, (a, b, x_path) in build(args.build.split(","), args.dir).items():
            print(f"{name}: A = ours, B = onnx2tf 2.6")
            run_pair(a, b, x_path, args)
        return
    if len(args.files) != 2:
        raise SystemExit("give two .tflite files, or --build MODELS --dir FOLDER")
    run_pair(*args.files, args.input, args)


if __name__ == "__main__":
    main()
