"""StableHLO targets: the chip facts and topologies live in tpu_backend.chips (looked up here), and the
one writer of their artifact (package and tpu_export.convert both use it)."""

from __future__ import annotations

from .registry import get_target

__all__ = ["chip_facts", "check_topology", "write_tpu_artifact"]


def chip_facts(target):
    """tpu_backend.chips.ChipSpec for a TPU target (HBM, peak bf16 FLOP/s, libtpu name, topologies, source)."""
    from tpu_export.tpu_backend.chips import chip_for_target

    t = get_target(target)
    if t.chip is None:
        raise ValueError(f"target {t.name!r} is not a TPU generation; TPU targets: "
                         f"{', '.join(n for n, x in _tpu_targets())}")
    return chip_for_target(t.name)


def check_topology(target, topology: str | None = None):
    """Parse ``topology`` for the target's chip (default: the target's default topology).

    An invalid one raises tpu_backend.chips.InvalidTopologyError listing the valid topologies.
    """
    from tpu_export.tpu_backend.chips import parse_topology

    t = get_target(target)
    chip_facts(t)
    return parse_topology(t.name, topology if topology is not None else t.default_topology)


def _tpu_targets():
    from .registry import TARGETS

    return [(n, t) for n, t in TARGETS.items() if getattr(t, "chip", None) is not None]


def write_tpu_artifact(prog, target, opts, path: str, say, *, export=None) -> dict:
    """Export ``prog`` for ``target`` with its checked options (XlaOptions / TpuOptions) and save it at
    ``path``; AOT-compiled for the chip when ``opts.aot`` and libtpu is installed. Returns the summary info.
    ``export``: what exports (``tpu_backend.export_program``'s call form; an LLM passes tpu_backend.llm's)."""
    import importlib.util

    from tpu_export import tpu_backend
    from tpu_export.converter.progress import heartbeat

    t = get_target(target)
    kwargs = opts.export_kwargs(t)
    with heartbeat(say, f"{t.name}: lowering to JAX and exporting StableHLO for {', '.join(t.platforms)}"):
        bundle = (export or tpu_backend.export_program)(prog, platforms=t.platforms, **kwargs)
    info = {"platforms": list(t.platforms), "precision": kwargs.get("precision", "highest")}
    if bundle.quant is not None:
        info["quant"] = {"scheme": bundle.quant, "int8_weights": len(bundle.quantized_weights)}
    if t.chip is not None and opts.aot:
        if importlib.util.find_spec("libtpu") is not None:
            topology = opts.topology or t.default_topology
            with heartbeat(say, f"{t.name}: AOT-compiling for {topology} with libtpu"):
                compiled = bundle.compile_for(t.name, topology, in_process=opts.aot_in_process)
            info["aot"] = {"topology": topology, "report": getattr(compiled, "report", None)}
        else:
            say(f"{t.name}: libtpu is not installed; writing StableHLO only (pip install 'libtpu==0.0.42.*' "
                "to add the AOT-compiled executable)")
    elif t.chip is not None:
        say(f"{t.name}: aot off: writing StableHLO only (a TPU host compiles it when it loads it)")
    say(f"{t.name}: writing {path}")
    tpu_backend.save(bundle, path)
    return info
