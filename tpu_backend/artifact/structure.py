"""Pytree structures as plain JSON data (never pickle).

A node is ``{"kind": "leaf", "name": ...}``, ``{"kind": "tuple"|"list", "items": [...]}``,
``{"kind": "dict", "keys": [...], "items": [...]}`` or ``{"kind": "namedtuple", "type": name,
"keys": [...], "items": [...]}``. Leaves are numbered in flattening order; ``name`` is the
TensorSpec name at that position. Other registered container types are recorded by their
type name with their keys and are rebuilt as dicts (or tuples when they carry no keys);
named tuples come back as plain tuples.
"""

from __future__ import annotations

from typing import Any

__all__ = ["from_treespec", "flatten", "unflatten", "leaf_names", "validate"]

_KINDS = {"leaf", "tuple", "list", "dict", "namedtuple"}


def from_treespec(spec, leaf_names: list[str]) -> dict:
    """torch.utils._pytree TreeSpec -> JSON structure with the given leaf names."""
    it = iter(leaf_names)

    def walk(s) -> dict:
        if s.is_leaf():
            return {"kind": "leaf", "name": next(it)}
        children = [walk(c) for c in s.children()]
        t = s.type
        if t is tuple:
            return {"kind": "tuple", "items": children}
        if t is list:
            return {"kind": "list", "items": children}
        if isinstance(t, type) and issubclass(t, dict):
            return {"kind": "dict", "keys": [_key(k) for k in s.context], "items": children}
        if isinstance(t, type) and issubclass(t, tuple) and hasattr(t, "_fields"):
            return {"kind": "namedtuple", "type": t.__name__, "keys": list(t._fields), "items": children}
        ctx = s.context
        if isinstance(ctx, (list, tuple)) and len(ctx) == len(children) and all(isinstance(k, str) for k in ctx):
            return {"kind": "dict", "type": getattr(t, "__name__", str(t)), "keys": list(ctx), "items": children}
        return {"kind": "tuple", "type": getattr(t, "__name__", str(t)), "items": children}

    out = walk(spec)
    rest = list(it)
    if rest:
        raise ValueError(f"structure has fewer leaves than names; left over {rest}")
    return out


def _key(k):
    if isinstance(k, (str, int)) and not isinstance(k, bool):
        return k
    raise TypeError(f"pytree dict key {k!r} is not a str or int; cannot record it in a manifest")


def leaf_names(node: dict) -> list[str]:
    if node["kind"] == "leaf":
        return [node["name"]]
    return [n for c in node["items"] for n in leaf_names(c)]


def validate(node: Any, where: str = "structure") -> None:
    """Raise ValueError unless ``node`` is a well-formed structure."""
    if not isinstance(node, dict) or not isinstance(node.get("kind"), str) or node["kind"] not in _KINDS:
        raise ValueError(f"{where}: expected a node with kind in {sorted(_KINDS)}, got {node!r:.80}")
    if node["kind"] == "leaf":
        if not isinstance(node.get("name"), str):
            raise ValueError(f"{where}: leaf without a str name")
        return
    items = node.get("items")
    if not isinstance(items, list):
        raise ValueError(f"{where}: {node['kind']} without an items list")
    if node["kind"] in ("dict", "namedtuple"):
        keys = node.get("keys")
        if not isinstance(keys, list) or len(keys) != len(items):
            raise ValueError(f"{where}: {node['kind']} keys do not match items")
        # flatten/unflatten look keys up in dicts: only str/int keys, as _key records them
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys) or len(set(keys)) != len(keys):
            raise ValueError(f"{where}: {node['kind']} keys must be distinct strings or ints")
    if "type" in node and not isinstance(node["type"], str):
        raise ValueError(f"{where}: type must be a string")
    for i, c in enumerate(items):
        validate(c, f"{where}[{i}]")


def flatten(node: dict, value: Any, path: str = "") -> list:
    """The leaves of ``value`` laid out as ``node`` says; TypeError naming the mismatch."""
    kind = node["kind"]
    if kind == "leaf":
        return [value]
    if kind in ("dict", "namedtuple") and isinstance(value, dict):
        missing = [k for k in node["keys"] if k not in value]
        extra = [k for k in value if k not in node["keys"]]
        if missing or extra:
            raise TypeError(f"{path or 'input'}: expected keys {node['keys']}, missing {missing}, unexpected {extra}")
        return [x for k, c in zip(node["keys"], node["items"]) for x in flatten(c, value[k], f"{path}[{k!r}]")]
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{path or 'input'}: expected a {kind} of {len(node['items'])}, got {type(value).__name__}")
    if len(value) != len(node["items"]):
        raise TypeError(f"{path or 'input'}: expected {len(node['items'])} values, got {len(value)}")
    return [x for i, (c, v) in enumerate(zip(node["items"], value)) for x in flatten(c, v, f"{path}[{i}]")]


def unflatten(node: dict, leaves: list) -> Any:
    it = iter(leaves)

    def build(n):
        kind = n["kind"]
        if kind == "leaf":
            return next(it)
        items = [build(c) for c in n["items"]]
        if kind == "tuple":
            return tuple(items)
        if kind == "list":
            return items
        if kind == "namedtuple":
            # Rebuilt as a plain tuple: creating a class from manifest text would be code from the file.
            return tuple(items)
        return dict(zip(n["keys"], items))

    return build(node)
