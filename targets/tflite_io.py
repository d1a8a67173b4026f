"""A .tflite's signatures as written: input/output names, shapes and dtypes, read from the file itself."""

from __future__ import annotations

import dataclasses

from tpu_export.edge.builder import type_names as tflite_type_names

__all__ = ["IoSpec", "signatures"]


@dataclasses.dataclass(frozen=True)
class IoSpec:
    name: str
    shape: tuple
    dtype: str  # numpy dtype name, e.g. "float32"


def signatures(tflite: bytes) -> dict[str, tuple[list[IoSpec], list[IoSpec]]]:
    """{signature key: (inputs, outputs)} in the SignatureDef's own order (the model's argument order).

    A model without SignatureDefs reports its first subgraph's inputs/outputs under "serving_default".
    """
    from ai_edge_litert import schema_py_generated as s

    m = s.Model.GetRootAs(tflite, 0)
    type_names = tflite_type_names()

    def spec(sg, name, index):
        t = sg.Tensors(index)
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        return IoSpec(name, shape, type_names.get(t.Type(), str(t.Type())))

    if not m.SignatureDefsLength():
        sg = m.Subgraphs(0)
        return {"serving_default": (
            [spec(sg, sg.Tensors(int(i)).Name().decode(), int(i)) for i in sg.InputsAsNumpy()],
            [spec(sg, sg.Tensors(int(i)).Name().decode(), int(i)) for i in sg.OutputsAsNumpy()])}
    out = {}
    for k in range(m.SignatureDefsLength()):
        sd = m.SignatureDefs(k)
        sg = m.Subgraphs(sd.SubgraphIndex())
        out[sd.SignatureKey().decode()] = (
            [spec(sg, sd.Inputs(i).Name().decode(), sd.Inputs(i).TensorIndex()) for i in range(sd.InputsLength())],
            [spec(sg, sd.Outputs(i).Name().decode(), sd.Outputs(i).TensorIndex()) for i in range(sd.OutputsLength())])
    return out
