"""One input or output of a signature as the artifact records it (manifest
``signatures[*].inputs[*]`` / ``outputs[*]``).

In memory it is a frozen dataclass read by attribute; JSON exists only at the manifest
boundary (``to_json`` when saving, ``from_json`` after the loader validated the manifest).
It differs from ``converter.program.TensorSpec`` in what an artifact adds: the dtype is the
artifact's name for it (a string, also for bfloat16), plus the mesh placement and the
symbolic shape jax exported.
"""

from __future__ import annotations

import dataclasses
import functools

__all__ = ["ArtifactTensorSpec"]


def _axes(sharding) -> tuple:
    """Hashable sharding: each entry None, an axis name, or a tuple of axis names."""
    return tuple(e if e is None or isinstance(e, str) else tuple(e) for e in sharding)


@dataclasses.dataclass(frozen=True)
class ArtifactTensorSpec:
    name: str
    shape: tuple  # ints, and dim-name strings for dynamic dims
    dtype: str  # the artifact's dtype name: "float32", "bfloat16", "int32", ...
    index_bound: int | None = None  # an input of ids into an embedding of this many rows
    sharding: tuple | None = None  # with a mesh: one entry per dim (None, an axis, or a tuple of axes)
    jax_shape: tuple | None = None  # the shape jax exported when a dynamic dim splits over a mesh axis

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.sharding is not None:
            object.__setattr__(self, "sharding", _axes(self.sharding))
        if self.jax_shape is not None:
            object.__setattr__(self, "jax_shape", tuple(self.jax_shape))

    @property
    def is_dynamic(self) -> bool:
        return any(isinstance(d, str) for d in self.shape)

    @functools.cached_property
    def check_spec(self) -> dict:
        """The plain spec converter.input_check takes (shared with the edge runtime), made once."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "index_bound": self.index_bound}

    def to_json(self) -> dict:
        """The manifest entry: keys in the order the format has always written them."""
        out: dict = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.index_bound is not None:
            out["index_bound"] = self.index_bound
        if self.sharding is not None:
            out["sharding"] = [e if e is None or isinstance(e, str) else list(e) for e in self.sharding]
        if self.jax_shape is not None:
            out["jax_shape"] = list(self.jax_shape)
        return out

    @classmethod
    def from_json(cls, d: dict) -> "ArtifactTensorSpec":
        """From a manifest entry that format.validate_manifest accepted."""
        return cls(d["name"], tuple(d["shape"]), d["dtype"], d.get("index_bound"), d.get("sharding"),
                   d.get("jax_shape"))
