"""A .tflite's signatures as the Model calls them: names, pytree specs and checkable input specs.

Input specs (converter.input_check's plain dicts) come from the flatbuffer itself (dtype, shape
signature with -1 for a free dim, quantization), refined by our ``tpu_export.structure`` metadata
where present (dim names and their exported ranges, channel-last layout, embedding id bounds).
A .tflite without that metadata (written by another converter) is checked against its own
signature: names, rank, static dims and dtype.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from tpu_export.converter._torch_compat import tree_flatten, treespec_loads
from tpu_export.converter.input_check import bind_inputs, to_numpy

__all__ = ["read_signatures", "bind", "quantize_floats"]

_STRUCTURE = "tpu_export.structure"  # written by edge.convert (JSON, never code)


@functools.lru_cache(maxsize=None)
def _numpy_type_name(code: int) -> str | None:
    """The numpy dtype name of a LiteRT TensorType; None for types numpy lacks (left unchecked)."""
    from tpu_export.edge.builder import type_names

    name = type_names().get(code)
    return name if name in np.sctypeDict else None


def read_signatures(data: bytes) -> dict:
    from ai_edge_litert import schema_py_generated as s

    m = s.Model.GetRootAs(data, 0)
    structure = {}
    for i in range(m.MetadataLength()):
        md = m.Metadata(i)
        if md.Name() and md.Name().decode() == _STRUCTURE:
            structure = json.loads(_buffer_bytes(data, m.Buffers(md.Buffer())).decode())
    sigs = {}
    for i in range(m.SignatureDefsLength()):
        sd = m.SignatureDefs(i)
        key = sd.SignatureKey().decode()
        sg = m.Subgraphs(sd.SubgraphIndex())
        tensors = {sd.Inputs(j).Name().decode(): sg.Tensors(sd.Inputs(j).TensorIndex())
                   for j in range(sd.InputsLength())}
        entry = {"inputs": list(tensors), "outputs": [sd.Outputs(j).Name().decode() for j in range(sd.OutputsLength())]}
        extra = structure.get(key, {})
        for k in ("inputs", "outputs"):
            if extra.get(k) and sorted(extra[k]) == sorted(entry[k]):
                entry[k] = extra[k]
        for k in ("in_spec", "out_spec"):
            if k in extra:
                try:
                    entry[k] = treespec_loads(extra[k])
                except Exception:  # noqa: BLE001 - unknown node types: flat names instead
                    pass
        entry["keywords"] = _keywords(entry["in_spec"]) if "in_spec" in entry else []
        meta = {e.get("name"): e for e in extra.get("input_specs", ()) if isinstance(e, dict)}
        entry["specs"] = [_spec(n, tensors[n], meta.get(n)) for n in entry["inputs"]]
        entry["dim_ranges"] = {d: tuple(r) for d, r in extra.get("dim_ranges", {}).items()}
        entry["quant"] = {i: sp.pop("_quant") for i, sp in enumerate(entry["specs"]) if "_quant" in sp}
        sigs[key] = entry
    return sigs


def _buffer_bytes(data, buf) -> bytes:
    """A buffer's bytes, inline or in the large-model form (Buffer.offset / size, after the flatbuffer): where
    ai-edge-quantizer moves every buffer of 1 KiB or more, our structure metadata of a many-layer LLM included."""
    from tpu_export.edge.quantize_prep import buffer_span

    start, size = buffer_span(buf)
    if start + size > len(data):
        raise ValueError(f"a metadata buffer lies past the file's end ({start}+{size} > {len(data)} bytes)")
    return bytes(data[start:start + size])


def _spec(name, tensor, meta) -> dict:
    sig = tensor.ShapeSignatureAsNumpy() if tensor.ShapeSignatureLength() else tensor.ShapeAsNumpy()
    shape = [None if d < 0 else int(d) for d in (sig if isinstance(sig, np.ndarray) else ())]
    spec = {"name": name, "dtype": _numpy_type_name(tensor.Type()), "shape": shape}
    if meta is not None and _agrees(meta.get("shape"), shape):
        spec["shape"] = list(meta["shape"])
        spec.update({k: meta[k] for k in ("index_bound", "channel_last") if k in meta})
    q = tensor.Quantization()
    if q is not None and q.ScaleLength() == 1 and spec["dtype"] in ("int8", "uint8", "int16"):
        spec["_quant"] = (float(q.Scale(0)), int(q.ZeroPoint(0)) if q.ZeroPointLength() else 0, spec["dtype"])
    return spec


def _agrees(meta_shape, shape) -> bool:
    """The metadata describes this tensor: same rank, the file's static dims, a name for each free one.
    A dim the program exported as dynamic stays dynamic where the file wrote a static size for it
    (the interpreter resizes it like any other)."""
    return isinstance(meta_shape, list) and len(meta_shape) == len(shape) and all(
        isinstance(d, str) or (f is not None and d == f) for d, f in zip(meta_shape, shape))


def bind(sig_name: str, entry: dict, args, kwargs) -> list:
    """The call's tensors in the signature's input order (converter.input_check.bind_inputs)."""
    spec = entry.get("in_spec")
    flatten = functools.partial(_flatten, spec, entry["keywords"]) if spec is not None else None
    return bind_inputs(sig_name, entry["inputs"], args, kwargs, flatten=flatten, keywords=entry["keywords"])


def _flatten(spec, keywords, args, kwargs) -> list:
    if set(kwargs) == set(keywords):  # the exported key order, whatever order the call used
        kwargs = {k: kwargs[k] for k in keywords}
    leaves, got = tree_flatten((tuple(args), dict(kwargs)))
    if got != spec:
        raise TypeError(f"not the {spec.num_leaves} tensors in the structure the model was exported with")
    return leaves


def _keywords(spec) -> list:
    """The top-level keyword names of an exported (args, kwargs) spec."""
    try:
        return [k for k in spec.children()[1].context if isinstance(k, str)]
    except (AttributeError, IndexError, TypeError):
        return []


def quantize_floats(entry: dict, flat: list) -> list:
    """A float given for an int8/uint8/int16 input is quantized with that input's scale and zero
    point, as the model's own QUANTIZE would; other values pass as they are."""
    if not entry["quant"]:
        return flat
    flat = list(flat)
    for i, (scale, zero, dtype) in entry["quant"].items():
        a = to_numpy(flat[i])
        if a.dtype.kind == "f" and scale:
            info = np.iinfo(dtype)
            flat[i] = np.clip(np.round(a / scale) + zero, info.min, info.max).astype(dtype)
    return flat
