"""What the graph-rewrite pass tests share: the ops a prepared program calls, and the program run on either backend
(the LiteRT interpreter, or the TPU path's StableHLO on PJRT CPU)."""

from __future__ import annotations

from tpu_export import litert_torch, tpu_backend
from tpu_export.edge import convert_program


def call_targets(prog) -> list:
    """Every call_function target of every signature of ``prog``."""
    return [n.target for s in prog.signatures.values() for n in s.graph.nodes if n.op == "call_function"]


def run_on(prog, backend: str):
    """``prog`` converted for ``backend`` ("litert" or "tpu"), callable like the module."""
    return litert_torch.Model(convert_program(prog)) if backend == "litert" else \
        tpu_backend.export_program(prog, platforms=("cpu",))
