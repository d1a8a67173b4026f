"""TPU targets: the chip facts and topologies live in tpu_backend.chips; this module only looks them up."""

from __future__ import annotations

from .registry import get_target

__all__ = ["chip_facts", "check_topology"]


def chip_facts(target):
    """tpu_backend.chips.ChipSpec for a TPU target (HBM, peak bf16 FLOP/s, libtpu name, topologies, source)."""
    from tpu_backend.chips import chip_for_target

    t = get_target(target)
    if t.chip is None:
        raise ValueError(f"target {t.name!r} is not a TPU generation; TPU targets: "
                         f"{', '.join(n for n, x in _tpu_targets())}")
    return chip_for_target(t.name)


def check_topology(target, topology: str | None = None):
    """Parse ``topology`` for the target's chip (default: the target's default topology).

    An invalid one raises tpu_backend.chips.InvalidTopologyError listing the valid topologies.
    """
    from tpu_backend.chips import parse_topology

    t = get_target(target)
    chip_facts(t)
    return parse_topology(t.name, topology if topology is not None else t.default_topology)


def _tpu_targets():
    from .registry import TARGETS

    return [(n, t) for n, t in TARGETS.items() if t.chip is not None]
