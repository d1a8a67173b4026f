"""TPU cost and memory of a decoder block with and without the Pallas kernels, per generation.

    .venv/bin/python bench/pallas_report.py            # seq 2048 and 8192, v5e v6e tpu7x
    .venv/bin/python bench/pallas_report.py --seq 2048 --gen v6e

Everything is AOT-compiled with libtpu for one chip of a described TPU slice
(``get_topology_desc("v6e:2x2", "tpu")``, one device of it) on this CPU-only host; nothing
runs. The block: RMSNorm -> q/k/v projections -> causal grouped-query attention (8 query
heads, 2 kv heads, head dim 128) -> output projection + residual -> RMSNorm -> SwiGLU MLP
(1024 -> 4096 -> 1024) + residual; dim 1024, batch 1, bf16, weights passed as arguments.

Host setup (set here before jax loads, only where unset):
- ``JAX_PLATFORMS=cpu``: jax's default backend stays the CPU; the TPU topology is still
  reachable through libtpu for AOT compiles.
- ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``: libtpu takes /tmp/libtpu_lockfile when it loads; without
  this a second jax process on the host (a test run) fails with "Internal error when
  accessing libtpu multi-process lockfile".
- ``TPU_SKIP_MDS_QUERY=1``, ``TPU_WORKER_HOSTNAMES=localhost``: no GCE metadata query and no
  worker-hostname error spam from libtpu's init on a host that is not a TPU VM.

How to read the numbers. ``bytes``, ``flops`` and ``optimal_seconds`` come from XLA's
``cost_analysis()`` of the compiled executable, ``temp`` from ``memory_analysis()``. XLA sees
a Mosaic kernel as a custom call: it counts the kernels' declared ``pl.CostEstimate``
(our norm kernels declare theirs) but jax's splash attention declares none, so XLA counts
only its operands and zero flops. For the kernel rows the script therefore adds a model of
splash's own work to XLA's figures: HBM bytes = q and o once, plus K and V once per
(query head, query block, visited kv block) -- a causal mask visits only the kv blocks on
or below the diagonal -- and flops = 4 * block_q * block_kv * D per visited block; its
time is max(flops / peak, bytes / bandwidth) with peak and bandwidth read back from XLA's
own cost model for the generation (a large bf16 matmul and a large elementwise op). Adding
the model on top of XLA's boundary count counts the kernel's operands twice, so the kernel
rows are an upper bound.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

for _k, _v in {
    "JAX_PLATFORMS": "cpu",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
}.items():
    os.environ.setdefault(_k, _v)

TOPOLOGIES = {"v5e": "v5e:2x2", "v6e": "v6e:2x2", "tpu7x": "tpu7x:2x2x1"}
DIM, HEADS, KV_HEADS, HEAD_DIM, FFN = 1024, 8, 2, 128, 4096
GOAL_BYTES, GOAL_SECONDS = 10.0, 5.0


def _device(gen):
    from jax.experimental import topologies

    return topologies.get_topology_desc(TOPOLOGIES[gen], "tpu").devices[0]


# XLA's cost model gives -1 s ("unknown") for the ConcatBitcast custom calls that sliced
# weight prefetch inserts, which makes a block's summed optimal_seconds negative. Without
# slicing the prefetch still happens, whole; the work is the same.
COMPILER_OPTIONS = {"xla_tpu_sliced_prefetch_max_slices": 0}


def _compile(fn, args):
    import jax

    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
    return lowered.compile(compiler_options=COMPILER_OPTIONS)


def _calibrate(dev):
    """(peak flop/s, HBM byte/s) XLA's cost model uses for this device."""
    import jax
    import jax.numpy as jnp

    sh = jax.sharding.SingleDeviceSharding(dev)
    a = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16, sharding=sh)
    mm = _compile(lambda x, y: x @ y, (a, a)).cost_analysis()
    b = jax.ShapeDtypeStruct((1 << 26,), jnp.float32, sharding=sh)
    ew = _compile(lambda x: x * 2 + 1, (b,)).cost_analysis()
    return mm["flops"] / mm["optimal_seconds"], ew["bytes accessed"] / ew["optimal_seconds"]


def splash_model(seq, blocks, itemsize=2):
    """(HBM bytes, flops) of causal splash attention for the bench shapes (batch 1)."""
    bq, bkv = blocks["block_q"], blocks["block_kv"]
    nq, nkv = math.ceil(seq / bq), math.ceil(seq / bkv)
    visited = sum(min(nkv, ((i + 1) * bq - 1) // bkv + 1) for i in range(nq))
    qo = 2 * HEADS * seq * HEAD_DIM * itemsize
    kv = 2 * HEADS * visited * bkv * HEAD_DIM * itemsize
    return qo + kv, 4 * HEADS * visited * bq * bkv * HEAD_DIM


def attention_fn(use_pallas, gen):
    from tpu_export.tpu_backend.pallas import PallasConfig, attention

    cfg = PallasConfig(mode=use_pallas, generation=gen)
    return lambda q, k, v: attention(q, k, v, is_causal=True, config=cfg)


def decoder_block_fn(use_pallas, gen):
    import jax

    from tpu_export.tpu_backend.pallas import PallasConfig, attention, rms_norm

    cfg = PallasConfig(mode=use_pallas, generation=gen)

    def block(w, x):
        b, s, _ = x.shape
        h = rms_norm(x, w["norm1"], 1e-6, config=cfg)
        q = (h @ w["wq"]).reshape(b, s, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        k = (h @ w["wk"]).reshape(b, s, KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        v = (h @ w["wv"]).reshape(b, s, KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        a = attention(q, k, v, is_causal=True, config=cfg)
        x = x + a.transpose(0, 2, 1, 3).reshape(b, s, HEADS * HEAD_DIM) @ w["wo"]
        h = rms_norm(x, w["norm2"], 1e-6, config=cfg)
        return x + (jax.nn.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]

    return block


def _specs(dev, seq):
    import jax
    import jax.numpy as jnp

    sh = jax.sharding.SingleDeviceSharding(dev)
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sh)
    attn = (s(1, HEADS, seq, HEAD_DIM), s(1, KV_HEADS, seq, HEAD_DIM), s(1, KV_HEADS, seq, HEAD_DIM))
    weights = {
        "norm1": s(DIM), "norm2": s(DIM),
        "wq": s(DIM, HEADS * HEAD_DIM), "wk": s(DIM, KV_HEADS * HEAD_DIM), "wv": s(DIM, KV_HEADS * HEAD_DIM),
        "wo": s(HEADS * HEAD_DIM, DIM),
        "w_gate": s(DIM, FFN), "w_up": s(DIM, FFN), "w_down": s(FFN, DIM),
    }
    return attn, (weights, s(1, seq, DIM))


def measure(gen, seq):
    """Rows of (scope, path, bytes, temp, optimal_seconds, flops) for one generation and seq."""
    from tpu_export.tpu_backend.pallas import block_sizes

    dev = _device(gen)
    peak, bw = _calibrate(dev)
    attn_args, block_args = _specs(dev, seq)
    blocks = block_sizes("attention", gen, (1, HEADS, KV_HEADS, seq, seq, HEAD_DIM), "bfloat16")
    k_bytes, k_flops = splash_model(seq, blocks)
    k_seconds = max(k_flops / peak, k_bytes / bw)
    rows = []
    for scope, make, args in (("attention", attention_fn, attn_args), ("block", decoder_block_fn, block_args)):
        for path, use in (("xla", False), ("pallas", True)):
            c = _compile(make(use, gen), args)
            ca, ma = c.cost_analysis(), c.memory_analysis()
            nbytes, secs, flops = ca["bytes accessed"], ca["optimal_seconds"], ca.get("flops", 0.0)
            if secs < 0:
                raise RuntimeError(f"{gen} seq {seq} {scope}/{path}: XLA reports optimal_seconds {secs} "
                                   "(an op of unknown cost); the sum is meaningless")
            if use:
                nbytes, secs, flops = nbytes + k_bytes, secs + k_seconds, flops + k_flops
            rows.append((scope, path, nbytes, ma.temp_size_in_bytes, secs, flops))
    return rows, blocks


def _fmt_bytes(n):
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, nargs="*", default=[2048, 8192])
    p.add_argument("--gen", nargs="*", default=list(TOPOLOGIES), choices=list(TOPOLOGIES))
    a = p.parse_args(argv)
    print("| gen | seq | scope | path | bytes accessed | temp bytes | optimal_seconds | flops |")
    print("|---|---|---|---|---|---|---|---|")
    verdicts = []
    for gen in a.gen:
        for seq in a.seq:
            t0 = time.time()
            rows, blocks = measure(gen, seq)
            for scope, path, nbytes, temp, secs, flops in rows:
                print(f"| {gen} | {seq} | {scope} | {path} | {_fmt_bytes(nbytes)} | {_fmt_bytes(temp)} | "
                      f"{secs * 1e3:.3f} ms | {flops / 1e9:.1f} G |")
            by = {(r[0], r[1]): r for r in rows}
            for scope in ("attention", "block"):
                x, k = by[(scope, "xla")], by[(scope, "pallas")]
                verdicts.append((gen, seq, scope, x[2] / k[2], x[4] / k[4], x[3], k[3], blocks, time.time() - t0))
    print()
    print("| gen | seq | scope | HBM bytes xla/pallas | optimal_seconds xla/pallas | temp xla -> pallas | goals |")
    print("|---|---|---|---|---|---|---|")
    all_met = True
    for gen, seq, scope, rb, rs, tx, tk, blocks, _ in verdicts:
        goal = ""
        if scope == "attention" and seq == max(a.seq):
            met = rb >= GOAL_BYTES and rs >= GOAL_SECONDS and tk < seq * seq
            all_met &= met
            goal = (f"{'MET' if met else 'NOT MET'} (>= {GOAL_BYTES:.0f}x bytes, >= {GOAL_SECONDS:.0f}x time, "
                    f"temp < seq^2 bytes; blocks q/kv {blocks['block_q']}/{blocks['block_kv']})")
        print(f"| {gen} | {seq} | {scope} | {rb:.1f}x | {rs:.1f}x | {_fmt_bytes(tx)} -> {_fmt_bytes(tk)} | {goal} |")
    print()
    print("goals at the longest sequence:", "all met" if all_met else "NOT all met")
    record(verdicts, max(a.seq))
    return 0 if all_met else 1


def record(verdicts, longest: int) -> None:
    """Append this run's ratio table to bench/results/pallas.json."""
    from render_pages import append_run  # bench/ is this script's sys.path[0]

    columns = [{"key": "gen", "label": "gen"}, {"key": "seq", "label": "seq"}, {"key": "scope", "label": "scope"},
               {"key": "bytes_ratio", "label": "HBM bytes xla/pallas", "fmt": ".1f", "suffix": "x"},
               {"key": "seconds_ratio", "label": "optimal_seconds xla/pallas", "fmt": ".1f", "suffix": "x"},
               {"key": "temp_xla_bytes", "label": "temp bytes xla", "fmt": ",.0f"},
               {"key": "temp_pallas_bytes", "label": "temp bytes pallas", "fmt": ",.0f"},
               {"key": "blocks", "label": "blocks q/kv"}]
    rows = [{"gen": gen, "seq": seq, "scope": scope, "bytes_ratio": rb, "seconds_ratio": rs, "temp_xla_bytes": tx,
             "temp_pallas_bytes": tk, "blocks": [blocks["block_q"], blocks["block_kv"]]}
            for gen, seq, scope, rb, rs, tx, tk, blocks, _ in verdicts]
    top = [r for r in rows if r["scope"] == "attention" and r["seq"] == longest]
    b = [r["bytes_ratio"] for r in top]
    t = [r["seconds_ratio"] for r in top]
    headline = (f"attention at {longest} tokens: {min(b):.1f}-{max(b):.1f}x fewer HBM bytes, "
                f"{min(t):.1f}-{max(t):.1f}x less optimal time with the kernels")
    append_run("pallas", columns, rows, headline)


if __name__ == "__main__":
    sys.exit(main())
