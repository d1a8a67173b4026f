"""report.json of a compiled target: XLA's cost and memory analysis with explicit scopes.

XLA reports the figures of one device's part of an SPMD-partitioned program. The report
gives each figure per device, per chip (a device is a chip on v5e/v6e/v5p, a TensorCore on
tpu7x) and for the whole program, next to the chip's HBM and bf16 peak with their source.

XLA answers "unknown" with a negative number (``optimal_seconds = -3.0`` for a real-size
ResNet on v6e) or by leaving a key out; such a figure is recorded as ``None`` with an
``unknown`` reason, never as a number. Beside XLA's figures sits our own roofline estimate
(``roofline``): the step time is at least the larger of XLA's FLOPs at the chip's bf16 peak and
the bytes at its HBM bandwidth, both facts with the page they come from (tpu_backend/chips.py).
"""

from __future__ import annotations

import math

from .versions import runtime_versions

__all__ = ["figures_of", "build_report", "unknown_reason", "roofline"]

# XLA's cost-analysis key -> our name
_COST_KEYS = {"flops": "flops", "transcendentals": "transcendentals", "bytes accessed": "bytes_accessed",
              "optimal_seconds": "optimal_seconds"}


def unknown_reason(key: str, raw) -> str | None:
    """Why XLA's figure ``key`` is not a number we can report (None: it is one). A count may be
    zero (a program with no transcendentals); a step time of zero or less is XLA's "unknown"."""
    if raw is None:
        return f"XLA's cost analysis has no {key!r} for this program"
    try:
        v = float(raw)
    except (TypeError, ValueError):
        return f"XLA's cost analysis gave {key} = {raw!r}, not a number"
    if not math.isfinite(v) or v < 0 or (key == "optimal_seconds" and v == 0):
        return f"XLA's cost analysis gave {key} = {v} (its 'unknown' for this program)"
    return None


def figures_of(compiled) -> dict:
    """XLA's cost and memory analysis of one compiled executable (per device). A cost figure
    XLA does not know is None, with the reason under ``unknown``."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    cost = cost or {}
    figures, unknown = {}, {}
    for xla_key, key in _COST_KEYS.items():
        why = unknown_reason(xla_key, cost.get(xla_key))
        figures[key] = None if why else float(cost[xla_key])
        if why:
            unknown[key] = why
    m = compiled.memory_analysis()
    return {
        "cost": figures,
        "unknown": unknown,
        "memory": {
            "argument_bytes": int(getattr(m, "argument_size_in_bytes", 0)),
            "output_bytes": int(getattr(m, "output_size_in_bytes", 0)),
            "temp_bytes": int(getattr(m, "temp_size_in_bytes", 0)),
            "alias_bytes": int(getattr(m, "alias_size_in_bytes", 0)),
            "generated_code_bytes": int(getattr(m, "generated_code_size_in_bytes", 0)),
        },
    }


def roofline(flops, nbytes, min_bytes, chip) -> dict:
    """Our own step-time estimate for one device's part: max(FLOPs / bf16 peak, bytes / HBM
    bandwidth), with XLA's bytes accessed and with the least bytes any schedule moves (arguments
    read once, outputs written once). A lower bound: a float32 program runs below the bf16 peak."""
    if chip is None:
        return {"value": None, "unknown": "no chip facts for these devices"}
    peak, bw = chip.peak_bf16_flops_per_device, chip.hbm_bandwidth_bytes_per_s_per_device
    out = {
        "scope": "whole_program: each device's part at its chip's peak; devices run in parallel",
        "peak_bf16_flops_per_device": peak,
        "hbm_bandwidth_bytes_per_s_per_device": bw,
        "sources": {"peak_bf16_flops": chip.source, "hbm_bandwidth": chip.bandwidth_source or None},
        "what": ("seconds >= max(XLA's FLOPs / bf16 peak, bytes / HBM bandwidth); 'xla_bytes' uses XLA's bytes "
                 "accessed (it counts each HBM->VMEM prefetch hop), 'least_bytes' the arguments read once and "
                 "the outputs written once"),
    }
    if flops is None:
        out["compute_seconds"] = {"value": None, "unknown": "XLA's FLOPs are unknown"}
    else:
        out["compute_seconds"] = flops / peak
    for name, b in (("xla_bytes", nbytes), ("least_bytes", min_bytes)):
        if b is None or bw is None:
            why = "XLA's bytes accessed are unknown" if b is None else "the chip's HBM bandwidth is not known"
            out[name] = {"value": None, "unknown": why}
            continue
        mem = b / bw
        if flops is None:
            out[name] = {"bytes": b, "memory_seconds": mem,
                         "seconds": {"value": None, "unknown": "XLA's FLOPs are unknown"}}
        else:
            out[name] = {"bytes": b, "memory_seconds": mem, "seconds": max(flops / peak, mem),
                         "bound": "compute" if flops / peak >= mem else "memory"}
    return out


def build_report(target, topology, libtpu_topology, chip, devices, mesh, per_sig, hbm) -> dict:
    """report.json: every figure labelled by scope (per device, per chip, whole program)."""
    n = len(devices)
    per_chip_factor = min(chip.devices_per_chip, n) if chip else 1
    chips_used = math.ceil(n / chip.devices_per_chip) if chip else None
    sigs = {}
    for name, f in per_sig.items():
        c, m, why = f["cost"], f["memory"], f.get("unknown", {})
        entry = {
            "input_shapes": f["input_shapes"],
            "compile_seconds": f["compile_seconds"],
            # "hit": the executable came from the AOT cache (tpu_backend/compile_cache.py) in compile_seconds
            **{k: f[k] for k in ("compile_cache", "compiled_seconds_when_stored") if k in f},
            "executable_bytes": f["executable_bytes"],
            "cost": {k: _scoped(c[k], per_chip_factor, n, chip, why.get(k))
                     for k in ("flops", "transcendentals", "bytes_accessed")},
            "memory": {k: _scoped(v, per_chip_factor, n, chip) for k, v in m.items()},
        }
        entry["cost"]["optimal_seconds"] = {
            "value": c["optimal_seconds"],
            "scope": "whole_program: XLA's estimated step time; all devices run their part in parallel",
        }
        if c["optimal_seconds"] is None:
            entry["cost"]["optimal_seconds"]["unknown"] = why.get("optimal_seconds", "unknown")
        if chip:
            if c["optimal_seconds"] is None or c["flops"] is None:
                entry["implied_utilisation_at_bf16_peak"] = {
                    "value": None, "unknown": why.get("optimal_seconds") or why.get("flops")}
            else:
                entry["implied_utilisation_at_bf16_peak"] = (
                    c["flops"] / (c["optimal_seconds"] * chip.peak_bf16_flops_per_device))
        least = m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"]
        entry["roofline"] = roofline(c["flops"], c["bytes_accessed"], least, chip)
        entry["hbm"] = {
            "needed_bytes_per_device": f["hbm_needed_bytes_per_device"],
            "available_bytes_per_device": hbm,
            "available_bytes_per_chip": chip.hbm_bytes_per_chip if chip else None,
            "fraction_used": (f["hbm_needed_bytes_per_device"] / hbm) if hbm else None,
        }
        sigs[name] = entry
    return {
        "target": target,
        "topology": topology,
        "libtpu_topology": libtpu_topology,
        "device_kind": devices[0].device_kind,
        "devices_used": n,
        "chips_used": chips_used,
        "mesh": mesh.to_json() if mesh is not None else None,
        "chip": None if chip is None else {
            "hbm_bytes_per_chip": chip.hbm_bytes_per_chip,
            "hbm_bytes_per_device": chip.hbm_bytes_per_device,
            "devices_per_chip": chip.devices_per_chip,
            "peak_bf16_flops_per_chip": chip.peak_bf16_flops_per_chip,
            "hbm_bandwidth_bytes_per_s_per_chip": chip.hbm_bandwidth_bytes_per_s,
            "source": chip.source,
            "bandwidth_source": chip.bandwidth_source or None,
        },
        "versions": runtime_versions(),
        "scopes": ("per_device: XLA's figure for one device's part of the (SPMD-partitioned) program; "
                   "per_chip: per_device x devices of one chip in use (a device is a chip on v5e/v6e/v5p, "
                   "a TensorCore on tpu7x); whole_program: per_device x devices_used (replicated "
                   "arguments count once per device); a figure XLA does not know is null with an 'unknown' "
                   "reason"),
        "signatures": sigs,
    }


def _scoped(v, per_chip_factor, n, chip, unknown: str | None = None) -> dict:
    if v is None:
        out = {"per_device": None, "whole_program": None, "unknown": unknown or "unknown"}
        if chip is not None:
            out["per_chip"] = None
        return out
    out = {"per_device": v, "whole_program": v * n}
    if chip is not None:
        out["per_chip"] = v * per_chip_factor
    return out
