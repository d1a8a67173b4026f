"""The backend protocol tpu_export.convert drives: support check and write, per backend.

Options are checked before capture by targets.options.options_for (one typed dataclass per target);
each backend entry then answers two questions for the one-call flow: can you lower this node, and
write the artifact for this target (into ``out_dir/<target name>/``) with its checked options.
"""

from __future__ import annotations

import os

__all__ = ["BACKENDS", "EdgeBackend", "TpuBackend"]


class EdgeBackend:
    name = "edge"

    @staticmethod
    def is_supported(node) -> bool:
        from tpu_export.edge import is_supported

        return is_supported(node)

    @staticmethod
    def write_for_target(prog, target, out_dir: str, opts, say) -> tuple[str, dict]:
        """Package ``prog`` for an edge target; returns (main .tflite path, info for summary.json)."""
        import dataclasses

        from .checks import package_edge
        from .compat import compatibility

        if opts.name is None:  # files are named after the target in a multi-target out_dir
            opts = dataclasses.replace(opts, name=target.name)
        written = package_edge(target, prog, os.path.join(out_dir, target.name), opts, say)
        main = next(p for f, p in written.items() if f.endswith(".tflite"))
        from tpu_export.edge.tflite_check import map_tflite

        tflite = map_tflite(main)  # the figures read the tables, never the weights: a map, not a copy of the file
        try:
            reports = [compatibility(tflite, target, delegate=d) for d in target.delegates]
        finally:
            tflite.close()
        info = {"files": sorted(written), "compatibility": {}}
        for d, rep in zip(target.delegates, reports):
            info["compatibility"][d] = {"accelerated": rep.accelerated_count, "fallback": rep.fallback,
                                        "total": rep.total}
        return main, info


class TpuBackend:
    name = "tpu"

    @staticmethod
    def is_supported(node) -> bool:
        from tpu_export.tpu_backend.lowering import is_supported

        return is_supported(node)

    @staticmethod
    def write_for_target(prog, target, out_dir: str, opts, say) -> tuple[str, dict]:
        from .tpu import write_tpu_artifact

        path = os.path.join(out_dir, target.name, "model.tpuexp")
        return path, write_tpu_artifact(prog, target, opts, path, say)


BACKENDS = {"edge": EdgeBackend, "tpu": TpuBackend}
