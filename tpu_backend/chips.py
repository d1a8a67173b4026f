"""TPU chip facts and topology names for AOT compilation.

Every number carries the public page it comes from. ``libtpu_name`` is the generation prefix
libtpu's topology parser accepts (``get_topology_desc("v6e:2x2", "tpu")``); ``device_kind`` is
what a PJRT device of that generation reports, used to match a stored executable at run time.
"""

from __future__ import annotations

import dataclasses
import math
import re

__all__ = ["ChipSpec", "KernelFacts", "Topology", "CHIPS", "TARGETS", "BY_GENERATION", "InvalidTopologyError",
           "chip_for_target", "parse_topology"]

GiB = 1024**3


class InvalidTopologyError(ValueError):
    """A target or topology name that the chip does not come in."""


MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class KernelFacts:
    """What the Pallas kernels size their blocks by (tpu_backend/pallas/config.py)."""

    name: str
    mxu: int  # systolic array width: 128 (v5e, v5p) or 256 (v6e, tpu7x)
    vmem_budget: int  # bytes a kernel may plan for: the compiler's default scoped VMEM limit
    max_rows: int  # row-block cap for the row-wise kernels (norms, int8 matmul M)


# vmem_budget is the default *scoped* VMEM limit Mosaic compiles against (not the physical size):
# kernels that plan within it need no compiler flag. v5e/v5p default to 16 MiB, v6e and tpu7x
# (Ironwood) to 32 MiB.
_KERNEL_128 = dict(mxu=128, vmem_budget=16 * MiB, max_rows=512)
_KERNEL_256 = dict(mxu=256, vmem_budget=32 * MiB, max_rows=1024)


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    target: str  # our target name, e.g. "tpu-v6e"
    libtpu_name: str  # libtpu's generation prefix, e.g. "v6e", "tpu7x"
    device_kind: str  # jax Device.device_kind on that generation
    hbm_bytes_per_chip: int
    peak_bf16_flops_per_chip: float
    devices_per_chip: int  # JAX devices per chip: TensorCores exposed one by one (tpu7x: 2)
    topologies: tuple[str, ...]  # documented slice shapes (chips), smallest first
    dims: int  # 2 for 2D tori (v5e, v6e), 3 for 3D (v5p, tpu7x)
    source: str  # the public page the numbers come from
    kernel: KernelFacts  # block-size facts for the Pallas kernels
    # HBM bandwidth per chip, bytes/s: what a memory-bound step (an LLM's decode) is limited by
    hbm_bandwidth_bytes_per_s: float | None = None
    bandwidth_source: str = ""

    @property
    def hbm_bandwidth_bytes_per_s_per_device(self) -> float | None:
        bw = self.hbm_bandwidth_bytes_per_s
        return None if bw is None else bw / self.devices_per_chip

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.hbm_bytes_per_chip // self.devices_per_chip

    @property
    def peak_bf16_flops_per_device(self) -> float:
        return self.peak_bf16_flops_per_chip / self.devices_per_chip


CHIPS: dict[str, ChipSpec] = {
    "tpu-v5e": ChipSpec(
        target="tpu-v5e",
        libtpu_name="v5e",
        device_kind="TPU v5 lite",
        # "HBM2 capacity and bandwidth: 16 GB, 819 GBps" (libtpu here reports 15.75 GiB usable,
        # so the chip carries 16 GiB).
        hbm_bytes_per_chip=16 * GiB,
        # "Peak compute per chip (bf16): 197 TFLOPs"
        peak_bf16_flops_per_chip=197e12,
        devices_per_chip=1,  # "Each v5e chip contains one TensorCore"
        topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        dims=2,
        source="https://cloud.google.com/tpu/docs/v5e",
        kernel=KernelFacts("v5e", **_KERNEL_128),
        # "HBM2 capacity and bandwidth: 16 GB, 819 GBps"
        hbm_bandwidth_bytes_per_s=819e9,
        bandwidth_source="https://cloud.google.com/tpu/docs/v5e",
    ),
    "tpu-v6e": ChipSpec(
        target="tpu-v6e",
        libtpu_name="v6e",
        device_kind="TPU v6 lite",
        # "HBM capacity per chip: 32 GB" (libtpu reports 31.25 GiB usable).
        hbm_bytes_per_chip=32 * GiB,
        # "Peak compute per chip (bf16): 918 TFLOPs"
        peak_bf16_flops_per_chip=918e12,
        devices_per_chip=1,  # "Each v6e chip contains one TensorCore"
        topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        dims=2,
        source="https://cloud.google.com/tpu/docs/v6e",
        kernel=KernelFacts("v6e", **_KERNEL_256),
        # "HBM bandwidth per chip: 1638 GBps" (the v6e page and the TPU7x page's table agree)
        hbm_bandwidth_bytes_per_s=1638e9,
        bandwidth_source="https://cloud.google.com/tpu/docs/v6e",
    ),
    "tpu-v5p": ChipSpec(
        target="tpu-v5p",
        libtpu_name="v5p",
        device_kind="TPU v5",
        # "HBM capacity per chip (GiB): 95" (TPU7x page, comparison table)
        hbm_bytes_per_chip=95 * GiB,
        # "Peak compute per chip (BF16) (TFLOPs): 459" (same table)
        peak_bf16_flops_per_chip=459e12,
        devices_per_chip=1,  # megacore: the chip's two TensorCores appear as one device
        topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8"),
        dims=3,
        source="https://cloud.google.com/tpu/docs/tpu7x (v5p column); https://cloud.google.com/tpu/docs/v5p",
        kernel=KernelFacts("v5p", **_KERNEL_128),
        # "HBM bandwidth per chip (GBps): 2765" (TPU7x page, v5p column)
        hbm_bandwidth_bytes_per_s=2765e9,
        bandwidth_source="https://cloud.google.com/tpu/docs/tpu7x (v5p column)",
    ),
    "tpu-v7x": ChipSpec(
        target="tpu-v7x",
        libtpu_name="tpu7x",
        device_kind="TPU7x",
        # "HBM capacity per chip (GiB): 192"
        hbm_bytes_per_chip=192 * GiB,
        # "Peak compute per chip (BF16) (TFLOPs): 2307"
        peak_bf16_flops_per_chip=2307e12,
        # "Each TPU7x chip contains two TensorCores"; libtpu exposes each as a device
        # (a 2x2x1 description has 8 devices, 94.75 GiB usable each).
        devices_per_chip=2,
        topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8"),
        dims=3,
        source="https://cloud.google.com/tpu/docs/tpu7x",
        kernel=KernelFacts("tpu7x", **_KERNEL_256),
        # "HBM bandwidth per chip (GBps): 7380" (shared by the chip's two TensorCores)
        hbm_bandwidth_bytes_per_s=7380e9,
        bandwidth_source="https://cloud.google.com/tpu/docs/tpu7x",
    ),
}

TARGETS = tuple(CHIPS)
# the same chips by libtpu's generation name ("v6e", "tpu7x"): one table, two ways in
BY_GENERATION: dict[str, ChipSpec] = {c.libtpu_name: c for c in CHIPS.values()}
_ALIASES = {"tpu-tpu7x": "tpu-v7x", "tpu7x": "tpu-v7x", "v7x": "tpu-v7x", "ironwood": "tpu-v7x"}


@dataclasses.dataclass(frozen=True)
class Topology:
    chip: ChipSpec
    shape: str  # e.g. "2x2" or "2x2x1"
    chips: int  # chips in the slice

    @property
    def libtpu_name(self) -> str:
        return f"{self.chip.libtpu_name}:{self.shape}"

    @property
    def devices(self) -> int:
        return self.chips * self.chip.devices_per_chip


def chip_for_target(target: str) -> ChipSpec:
    key = target.lower()
    key = _ALIASES.get(key, key)
    if not key.startswith("tpu-"):
        key = "tpu-" + key
    key = _ALIASES.get(key, key)
    if key not in CHIPS:
        raise InvalidTopologyError(f"unknown TPU target {target!r}; valid targets: {', '.join(TARGETS)}")
    return CHIPS[key]


def parse_topology(target: str, topology: str | None = None) -> Topology:
    """``("tpu-v6e", "2x2")`` -> Topology. ``None`` means one chip.

    Accepts the documented slice shapes of the chip (``chip.topologies``), one chip, and, for
    the 3D generations, any AxBxC whose sides are 1, 2 or multiples of 4 (the Cloud TPU docs'
    rule for 3D slices); libtpu refuses what it cannot lay out. A libtpu-style prefix
    ("v6e:2x2") must name the same generation.
    """
    chip = chip_for_target(target)
    if topology is None:
        return Topology(chip, "x".join(["1"] * chip.dims), 1)
    prefix, _, shape = topology.strip().lower().rpartition(":")
    if prefix and prefix != chip.libtpu_name:
        raise InvalidTopologyError(f"topology {topology!r} names {prefix!r}, not {chip.target} "
                                   f"({chip.libtpu_name!r})")
    if not re.fullmatch(r"\d+(x\d+)*", shape):
        raise InvalidTopologyError(_invalid(chip, topology))
    sides = [int(s) for s in shape.split("x")]
    if chip.dims == 3 and len(sides) == 2:
        sides.append(1)
    canon = "x".join(map(str, sides))
    ok = len(sides) == chip.dims and all(s >= 1 for s in sides)
    if ok and canon not in chip.topologies and set(sides) != {1}:
        # 3D slices come in more shapes than the table lists: sides of 1, 2 or multiples of 4.
        ok = chip.dims == 3 and all(s in (1, 2) or s % 4 == 0 for s in sides)
    if not ok:
        raise InvalidTopologyError(_invalid(chip, topology))
    return Topology(chip, canon, math.prod(sides))


def _invalid(chip: ChipSpec, topology: str) -> str:
    return (
        f"invalid topology {topology!r} for {chip.target}; valid topologies: {', '.join(chip.topologies)}"
        + (" (or any AxBxC with sides 1, 2 or multiples of 4)" if chip.dims == 3 else "")
        + f" (source: {chip.source})"
    )
