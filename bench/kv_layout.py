"""Decode attention alone, per KV-cache layout: what XNNPACK's per-step work on the caches costs.

    .venv/bin/python bench/kv_layout.py [--config llama|gemma3|tinyllama] [--cache 1024] [--layers 10]

XNNPACK packs a BATCH_MATMUL's right-hand operand on every invoke when it is not a constant, so a decode step
packs each layer's K and V caches: the layout of the caches decides which packing runs. Four graphs with the
attention of one decode token (GQA folded: the q heads of a kv head are the rows) over ``--layers`` caches, each
converted by us and run in LiteRT's interpreter (1 thread, XNNPACK), alternating in blocks, CPU ms per invoke:

  k[S,D] v[S,D]   ours (edge/ops_attention.py): q @ K^T as adj_y (goi packing), p @ V plain (gio packing)
  k[S,D] v[D,S]   litert-torch's transposed layout (K sequence axis 2, V axis 3): both adj_y (goi)
  k[D,S] v[S,D]   both plain (gio)
  lhs             the caches as the left operands (K @ q^T, V^T @ p^T): no cache packing, small-N GEMMs
  elementwise     MUL + SUM (broadcast q over K, p over V): no GEMM, no packing, a rows x S x D product

Dims are the bench models' (bench/llm.py): llama 4 kv heads x 3 q heads of 64, gemma3 1 x 4 of 256, tinyllama
(the ~1B) 4 x 8 of 64.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIGS = {"llama": (4, 3, 64), "gemma3": (1, 4, 256), "tinyllama": (4, 8, 64)}  # kv heads, q per kv, head dim
LAYOUTS = {"k[S,D] v[S,D]": ("sd", "sd"), "k[S,D] v[D,S]": ("sd", "ds"), "k[D,S] v[S,D]": ("ds", "sd"),
           "lhs": ("sd", "ds"), "elementwise": ("sd", "sd")}


class DecodeAttention(torch.nn.Module):
    def __init__(self, k_layout: str, v_layout: str, lhs: str, layers: int):
        super().__init__()
        self.k_layout, self.v_layout, self.lhs, self.layers = k_layout, v_layout, lhs, layers

    def forward(self, q, mask, *caches):
        outs = []
        for i in range(self.layers):
            k, v = caches[2 * i], caches[2 * i + 1]
            if self.lhs == "elementwise":
                s = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1)  # [1, kv, rows, S]
                p = torch.softmax(s + mask, -1)
                outs.append((p.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2))
                continue
            if self.lhs:
                p = torch.softmax(k @ q.transpose(-1, -2) + mask.transpose(-1, -2), -2)  # [1, kv, S, rows]
                outs.append((v @ p).transpose(-1, -2))
                continue
            s = q @ (k.transpose(-1, -2) if self.k_layout == "sd" else k)
            p = torch.softmax(s + mask, -1)
            outs.append(p @ (v if self.v_layout == "sd" else v.transpose(-1, -2)))
        return torch.cat(outs, -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="llama", choices=sorted(CONFIGS))
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=15)
    a = ap.parse_args()
    from ai_edge_litert.interpreter import Interpreter

    from tpu_export import litert_torch

    kv, rows, d = CONFIGS[a.config]
    torch.manual_seed(0)
    interpreters = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (kl, vl) in LAYOUTS.items():
            shape = {"sd": (1, kv, a.cache, d), "ds": (1, kv, d, a.cache)}
            args = (torch.randn(1, kv, rows, d), torch.zeros(1, 1, 1, a.cache)) + tuple(
                torch.randn(shape[kl if j == 0 else vl]) for _ in range(a.layers) for j in range(2))
            path = os.path.join(tmp, f"{len(interpreters)}.tflite")
            form = name if name in ("lhs", "elementwise") else ""
            litert_torch.convert(DecodeAttention(kl, vl, form, a.layers).eval(), args).export(path)
            it = Interpreter(path, num_threads=1)
            it.allocate_tensors()
            for det, x in zip(it.get_input_details(), args):
                it.set_tensor(det["index"], x.numpy())
            it.invoke()
            interpreters[name] = it
    ms = {name: [] for name in interpreters}
    for b in range(a.blocks):
        order = list(interpreters) if b % 2 == 0 else list(reversed(interpreters))
        for name in order:
            it = interpreters[name]
            t = time.process_time()
            for _ in range(10):
                it.invoke()
            ms[name].append((time.process_time() - t) / 10 * 1e3)
    base = statistics.median(ms["k[S,D] v[S,D]"])
    print(f"{a.config}: {kv} kv heads x {rows} rows of {d}, cache {a.cache}, {a.layers} layers, 1 thread")
    for name, v in ms.items():
        med = statistics.median(v)
        print(f"  {name:14s} {med:7.3f} CPU ms per step  ({med / base:.2f}x ours)")


if __name__ == "__main__":
    main()
