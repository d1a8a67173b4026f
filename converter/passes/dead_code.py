"""Remove nodes whose results nobody reads, and weights no signature reads."""

from __future__ import annotations

from ..program import Program
from ._util import drop_unused_weights, sync_weights


def remove_dead_code(prog: Program) -> None:
    for sig in prog.signatures.values():
        sig.graph.eliminate_dead_code()
        sync_weights(prog, sig)
    drop_unused_weights(prog)
