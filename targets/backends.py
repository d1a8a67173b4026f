"""The backend protocol converter.convert drives: validate options, support check, write.

Each backend entry answers three questions for the one-call flow: are these options mine,
can you lower this node, and write the artifact for this target.
"""

from __future__ import annotations

import os

from .flow import EDGE_OPTIONS, write_edge_target

__all__ = ["BACKENDS", "EdgeBackend", "TpuBackend"]

TPU_OPTIONS = {"topology", "use_pallas", "dtype", "quant_config", "mesh", "partition_rules", "aot"}


def _check_known(target, options, known, other):
    unknown = set(options) - known - other
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))} for target {target.name!r}; "
                        f"{target.backend} targets take {', '.join(sorted(known))}")


class EdgeBackend:
    name = "edge"

    @staticmethod
    def validate_options(target, options):
        _check_known(target, options, EDGE_OPTIONS, TPU_OPTIONS)
        from .checks import resolve_quant

        # a scheme the runtime cannot run, or static int8 without calibration data, fails before capture
        resolve_quant(target, {k: v for k, v in options.items() if k in EDGE_OPTIONS})

    @staticmethod
    def is_supported(node) -> bool:
        from edge import is_supported

        return is_supported(node)

    @staticmethod
    def write_for_target(prog, target, out_dir, options, say):
        return write_edge_target(prog, target.name, out_dir, options, say)


class TpuBackend:
    name = "tpu"

    @staticmethod
    def validate_options(target, options):
        _check_known(target, options, TPU_OPTIONS, EDGE_OPTIONS)
        _tpu_export_options(target, options)  # a bad quant_config / dtype / use_pallas fails before capture
        if "topology" in options and target.chip is not None:
            from .tpu import check_topology

            check_topology(target, options["topology"])  # a bad topology fails before capture

    @staticmethod
    def is_supported(node) -> bool:
        from tpu_backend.lowering import is_supported

        return is_supported(node)

    @staticmethod
    def write_for_target(prog, target, out_dir, options, say):
        import tpu_backend

        opts = {k: v for k, v in options.items() if k in TPU_OPTIONS}
        export_kw = _tpu_export_options(target, opts)
        say(f"{target.name}: lowering to JAX and exporting StableHLO for {', '.join(target.platforms)}")
        bundle = tpu_backend.export_program(prog, platforms=target.platforms, **export_kw)
        info = {"platforms": list(target.platforms)}
        if bundle.quant is not None:
            info["quant"] = {"scheme": bundle.quant, "int8_weights": len(bundle.quantized_weights)}
        if target.chip is not None and opts.get("aot", True) and _libtpu_available():
            topology = opts.get("topology") or target.default_topology
            say(f"{target.name}: AOT-compiling for {topology} with libtpu")
            compiled = bundle.compile_for(target.name, topology)
            info["aot"] = {"topology": topology}
            info["aot"]["report"] = getattr(compiled, "report", None)
        elif target.chip is not None:
            say(f"{target.name}: libtpu is not installed; writing StableHLO only (pip install 'libtpu==0.0.42.*' "
                "to add the AOT-compiled executable)")
        path = os.path.join(out_dir, target.name, "model.tpuexp")
        say(f"{target.name}: writing {path}")
        tpu_backend.save(bundle, path)
        return path, info


def _tpu_export_options(target, opts) -> dict:
    """export_program keywords for a TPU-backend target. TPU chips default to use_pallas="auto"
    (kernels where their shape rules expect a gain) with blocks sized for the target's chip;
    CPU/GPU targets default to plain XLA (no TPU platform in the artifact to run a kernel on)."""
    kw = {}
    dtype = opts.get("dtype")
    if dtype in ("bfloat16", "bf16"):
        kw["dtype"] = "bfloat16"
    elif dtype not in (None, "float32", "fp32"):
        raise ValueError(f"target {target.name!r}: dtype {dtype!r} is not supported; use 'float32' or 'bfloat16'")
    quant = opts.get("quant_config")
    if quant is not None:
        from tpu_backend.quant import parse_quant

        try:
            kw["quant"] = parse_quant(quant)
        except ValueError as e:
            raise ValueError(f"target {target.name!r}: {e}") from None
    use_pallas = opts.get("use_pallas", "auto" if target.chip is not None else False)
    if use_pallas not in (True, False, "auto") and type(use_pallas).__name__ != "PallasConfig":
        raise ValueError(f"target {target.name!r}: use_pallas must be True, False or 'auto', got {use_pallas!r}")
    kw["use_pallas"] = use_pallas
    from tpu_backend.pallas.config import GENERATIONS  # pure Python: no jax import

    if target.chip in GENERATIONS:
        kw["generation"] = target.chip
    for k in ("mesh", "partition_rules"):
        if k in opts:
            kw[k] = opts[k]
    return kw


def _libtpu_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


BACKENDS = {"edge": EdgeBackend, "tpu": TpuBackend}
