"""Optional SPMD layout of an export: a device mesh and partition rules.

* Data parallel: dim 0 of every input (and of every output whose dim 0 is the batch) is split
  over the mesh's data axis.
* Tensor parallel: weights chosen by name pattern get a partition spec, e.g. Megatron-style
  column-parallel ``r".*fc1\\.weight" -> ("model", None)`` (torch Linear weights are
  [out, in], so this splits the output features) and row-parallel ``r".*fc2\\.weight" ->
  (None, "model")``. Weights no pattern matches are replicated.

Specs are stored in the manifest as JSON lists: one entry per dim, ``null`` (not split), an
axis name, or a list of axis names.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Iterable

__all__ = ["MeshSpec", "PartitionRules", "ShardingError", "spec_to_json", "spec_from_json", "named_sharding"]


class ShardingError(ValueError):
    """A mesh or partition rule that cannot apply to the program."""


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    axis_names: tuple[str, ...]
    shape: tuple[int, ...]

    def __post_init__(self):
        if len(self.axis_names) != len(self.shape) or not self.axis_names:
            raise ShardingError(f"mesh axis names {self.axis_names} do not match its shape {self.shape}")
        if len(set(self.axis_names)) != len(self.axis_names):
            raise ShardingError(f"mesh axis names repeat: {self.axis_names}")
        if any(not isinstance(s, int) or s < 1 for s in self.shape):
            raise ShardingError(f"mesh sizes must be positive ints, got {self.shape}")

    @classmethod
    def of(cls, mesh: Any) -> "MeshSpec":
        """From a MeshSpec, a {"data": 2, "model": 2} dict, or a jax Mesh / AbstractMesh."""
        if isinstance(mesh, MeshSpec):
            return mesh
        if isinstance(mesh, dict):
            return cls(tuple(mesh), tuple(int(v) for v in mesh.values()))
        if hasattr(mesh, "axis_names") and hasattr(mesh, "axis_sizes"):
            return cls(tuple(mesh.axis_names), tuple(int(s) for s in mesh.axis_sizes))
        if hasattr(mesh, "axis_names") and hasattr(mesh, "shape"):
            return cls(tuple(mesh.axis_names), tuple(int(mesh.shape[a]) for a in mesh.axis_names))
        raise ShardingError(f"cannot read a mesh from {mesh!r}; pass e.g. {{'data': 2, 'model': 2}}")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def axis_size(self, axes) -> int:
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        return math.prod(self.shape[self.axis_names.index(a)] for a in axes)

    def abstract(self):
        from jax.sharding import AbstractMesh

        return AbstractMesh(self.shape, self.axis_names)

    def concrete(self, devices: list):
        """A jax Mesh over ``devices`` (the first ``size`` of them, in a topology-aware order
        for TPU devices)."""
        import numpy as np
        from jax.sharding import Mesh

        if len(devices) < self.size:
            raise ShardingError(
                f"this program is sharded over a {self.describe()} mesh ({self.size} devices); "
                f"only {len(devices)} device(s) are available"
            )
        devs = list(devices)[: self.size]
        try:
            from jax.experimental import mesh_utils

            arr = mesh_utils.create_device_mesh(self.shape, devs)
        except Exception:  # noqa: BLE001 - CPU devices have no physical layout to honour
            arr = np.array(devs, dtype=object).reshape(self.shape)
        return Mesh(arr, self.axis_names)

    def describe(self) -> str:
        return "x".join(f"{a}={s}" for a, s in zip(self.axis_names, self.shape))

    def to_json(self) -> dict:
        return {"axis_names": list(self.axis_names), "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: dict) -> "MeshSpec":
        return cls(tuple(d["axis_names"]), tuple(d["shape"]))


def spec_to_json(spec) -> list:
    out = []
    for e in spec:
        if e is None or isinstance(e, str):
            out.append(e)
        else:
            out.append(list(e))
    return out


def spec_from_json(spec: list):
    from jax.sharding import PartitionSpec

    return PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in spec])


def named_sharding(mesh, spec: list):
    from jax.sharding import NamedSharding

    return NamedSharding(mesh, spec_from_json(spec))


@dataclasses.dataclass(frozen=True)
class PartitionRules:
    """Partition specs for weights by name pattern (``re.fullmatch``; first match wins) and
    the mesh axis that splits the batch (dim 0 of inputs); ``data_axis=None`` turns that off."""

    weights: tuple[tuple[str, tuple], ...] = ()
    data_axis: str | None = "data"

    @classmethod
    def of(cls, rules: Any) -> "PartitionRules":
        if rules is None:
            return cls()
        if isinstance(rules, PartitionRules):
            return rules
        items: Iterable = rules.items() if isinstance(rules, dict) else rules
        return cls(tuple((str(p), tuple(s)) for p, s in items))

    def weight_spec(self, name: str, shape: tuple, mesh: MeshSpec) -> list:
        for pattern, spec in self.weights:
            if re.fullmatch(pattern, name):
                return _checked(list(spec), shape, mesh, f"weight {name!r} (rule {pattern!r})")
        return [None] * len(shape)

    def batch_spec(self, shape: tuple, mesh: MeshSpec, what: str) -> list:
        """Dim 0 over the data axis when the mesh has one and dim 0 divides (or is dynamic)."""
        spec = [None] * len(shape)
        if self.data_axis is None or self.data_axis not in mesh.axis_names or not shape:
            return spec
        d0 = shape[0]
        if isinstance(d0, str) or d0 % mesh.axis_size(self.data_axis) == 0:
            spec[0] = self.data_axis
        return spec

    def to_json(self) -> dict:
        return {"weights": [[p, spec_to_json(s)] for p, s in self.weights], "data_axis": self.data_axis}


def _checked(spec: list, shape: tuple, mesh: MeshSpec, what: str) -> list:
    if len(spec) > len(shape):
        raise ShardingError(f"{what}: spec {spec} has {len(spec)} entries but the tensor has rank {len(shape)}")
    spec = spec + [None] * (len(shape) - len(spec))
    used: list[str] = []
    for dim, (e, size) in enumerate(zip(spec, shape)):
        if e is None:
            continue
        axes = (e,) if isinstance(e, str) else tuple(e)
        for a in axes:
            if a not in mesh.axis_names:
                raise ShardingError(f"{what}: axis {a!r} is not in the mesh {mesh.describe()}")
            if a in used:
                raise ShardingError(f"{what}: axis {a!r} is used twice in {spec}")
            used.append(a)
        n = mesh.axis_size(axes)
        if isinstance(size, int) and size % n:
            raise ShardingError(f"{what}: dim {dim} of size {size} does not divide over {axes} ({n} devices)")
    return spec_to_json(spec)
