"""report.json of a compiled target: XLA's cost and memory analysis with explicit scopes.

XLA reports the figures of one device's part of an SPMD-partitioned program. The report
gives each figure per device, per chip (a device is a chip on v5e/v6e/v5p, a TensorCore on
tpu7x) and for the whole program, next to the chip's HBM and bf16 peak with their source.
"""

from __future__ import annotations

import math

from .versions import runtime_versions

__all__ = ["figures_of", "build_report"]


def figures_of(compiled) -> dict:
    """XLA's cost and memory analysis of one compiled executable (per device)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    cost = cost or {}
    m = compiled.memory_analysis()
    return {
        "cost": {
            "flops": float(cost.get("flops", 0.0)),
            "transcendentals": float(cost.get("transcendentals", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "optimal_seconds": float(cost.get("optimal_seconds", 0.0)),
        },
        "memory": {
            "argument_bytes": int(getattr(m, "argument_size_in_bytes", 0)),
            "output_bytes": int(getattr(m, "output_size_in_bytes", 0)),
            "temp_bytes": int(getattr(m, "temp_size_in_bytes", 0)),
            "alias_bytes": int(getattr(m, "alias_size_in_bytes", 0)),
            "generated_code_bytes": int(getattr(m, "generated_code_size_in_bytes", 0)),
        },
    }


def build_report(target, topology, libtpu_topology, chip, devices, mesh, per_sig, hbm) -> dict:
    """report.json: every figure labelled by scope (per device, per chip, whole program)."""
    n = len(devices)
    per_chip_factor = min(chip.devices_per_chip, n) if chip else 1
    chips_used = math.ceil(n / chip.devices_per_chip) if chip else None
    sigs = {}
    for name, f in per_sig.items():
        c, m = f["cost"], f["memory"]
        entry = {
            "input_shapes": f["input_shapes"],
            "compile_seconds": f["compile_seconds"],
            "executable_bytes": f["executable_bytes"],
            "cost": {k: _scoped(c[k], per_chip_factor, n, chip)
                     for k in ("flops", "transcendentals", "bytes_accessed")},
            "memory": {k: _scoped(v, per_chip_factor, n, chip) for k, v in m.items()},
        }
        entry["cost"]["optimal_seconds"] = {
            "value": c["optimal_seconds"],
            "scope": "whole_program: XLA's estimated step time; all devices run their part in parallel",
        }
        if chip:
            peak = chip.peak_bf16_flops_per_device
            entry["implied_utilisation_at_bf16_peak"] = (
                c["flops"] / (c["optimal_seconds"] * peak) if c["optimal_seconds"] > 0 else None)
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
            "source": chip.source,
        },
        "versions": runtime_versions(),
        "scopes": ("per_device: XLA's figure for one device's part of the (SPMD-partitioned) program; "
                   "per_chip: per_device x devices of one chip in use (a device is a chip on v5e/v6e/v5p, "
                   "a TensorCore on tpu7x); whole_program: per_device x devices_used (replicated "
                   "arguments count once per device)"),
        "signatures": sigs,
    }


def _scoped(v, per_chip_factor, n, chip) -> dict:
    out = {"per_device": v, "whole_program": v * n}
    if chip is not None:
        out["per_chip"] = v * per_chip_factor
    return out
