"""HBM traffic of a compiled TPU executable, counted from its optimized HLO's memory spaces.

Why not only XLA's ``bytes accessed``: the cost analysis of a TPU executable runs on the HLO after memory-space
assignment, where a weight streamed into VMEM appears as several ops (``copy-start``/``copy-done``,
``slice-start``/``slice-done``, a ``ConcatBitcast`` custom call, then the fusion that reads it), each counted
with its operands and outputs: a weight read once from HBM is counted three to five times (measured: 600 MB per
Llama layer of 122 MB of weights and 67 MB of KV cache). This counts what crosses HBM instead: for each
instruction of the entry computation, the operands whose layout is in HBM (memory space 0; VMEM is ``S(1)``) and
its outputs in HBM, with these rules:

- an async ``copy-start`` / ``slice-start`` (or a ``dynamic-slice``) reads only what it copies, and writes HBM
  only when its destination is there (a prefetch into VMEM does not);
- a ``dynamic-update-slice`` whose operand is in HBM runs in place: it writes the update, reads nothing else;
- a fusion that gathers (an embedding lookup) reads the rows it produces, not the table;
- a Pallas kernel (``tpu_custom_call``) reads each HBM operand whole (a static upper bound: the decode kernel
  fetches only the visible cache blocks, at most all of them).

It is an estimate from the program's structure, labelled as such in the report next to XLA's own figure.
"""

from __future__ import annotations

import math
import re

__all__ = ["hbm_traffic_bytes"]

_ITEM = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
         "s64": 8, "u64": 8, "f64": 8}
# one array: dtype[dims]{layout}; the layout's ":...S(n)" names the memory space (absent: 0, HBM)
_ARRAY = re.compile(r"\b(pred|[su](?:8|16|32|64)|bf16|f16|f32|f64)\[([\d,]*)\](\{[^}]*\})?")
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*?\)|\S+) ([\w\-]+)\((.*)$")
_FREE = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "copy-done", "slice-done",
         "after-all", "partition-id", "replica-id"}


def _arrays(text: str) -> list[tuple[int, bool]]:
    """(bytes, in HBM) of each array in a shape string (a tuple shape gives several)."""
    out = []
    for dt, dims, layout in _ARRAY.findall(text):
        n = math.prod(int(d) for d in dims.split(",") if d) * _ITEM[dt]
        out.append((n, "S(" not in (layout or "") or "S(0)" in (layout or "")))
    return out


def hbm_traffic_bytes(hlo_text: str) -> int:
    """Bytes read from and written to HBM by one run of the entry computation of ``hlo_text`` (a compiled
    executable's ``as_text()``), by the rules of the module doc."""
    start = hlo_text.find("\nENTRY")
    if start < 0:
        raise ValueError("no ENTRY computation in the HLO text")
    shapes: dict[str, list] = {}
    gathers = {m.group(1) for m in re.finditer(r"%([\w.\-]+) = [^\n]*? gather\(", hlo_text)}
    total = 0
    for line in hlo_text[start:].splitlines()[1:]:
        m = _INSTR.match(line)
        if not m:
            continue
        name, shape, op, rest = m.groups()
        outs = _arrays(shape)
        shapes[name] = outs
        if op in _FREE:
            continue
        operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
        out_hbm = sum(n for n, hbm in outs if hbm)
        out_all = sum(n for n, _ in outs)
        src_hbm = bool(operands) and any(h for _, h in shapes.get(operands[0], []))
        if op in ("copy-start", "slice-start"):
            # async copy tuples: copy-start (destination, source alias, context), slice-start (source alias,
            # destination, context): the destination is read from the source and written where it lives
            n, hbm = outs[0] if op == "copy-start" else outs[1]
            total += (n if src_hbm else 0) + (n if hbm else 0)
            continue
        if op in ("dynamic-slice", "slice"):
            total += (out_all if src_hbm else 0) + out_hbm
            continue
        if op == "dynamic-update-slice":
            src = shapes.get(operands[0], [])
            upd = sum(n for n, _ in shapes.get(operands[1], [])) if len(operands) > 1 else 0
            if any(h for _, h in src):  # in place in HBM: the update is written, the rest untouched
                total += upd
                continue
        calls = re.search(r"calls=%([\w.\-]+)", rest)
        if op == "fusion" and calls and _fusion_gathers(hlo_text, calls.group(1), gathers):
            total += out_all + out_hbm  # the gathered rows are read, the result written
            continue
        total += sum(n for o in operands for n, hbm in shapes.get(o, []) if hbm) + out_hbm
    return total


def _fusion_gathers(hlo_text: str, comp: str, gathers: set) -> bool:
    i = hlo_text.find(f"%{comp} (")
    if i < 0:
        return False
    body = hlo_text[i: hlo_text.find("\n}", i)]
    return any(f"%{g} =" in body for g in gathers)
