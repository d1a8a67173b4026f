"""A read-only view of a .tflite's operators: name, version, tensors (dtype, shape, constness), options.

Read with ai_edge_litert's generated schema; only operator options are unpacked through the object
API, so weights are never copied.
"""

from __future__ import annotations

import dataclasses

from tpu_export.edge.builder import builtin_names
from tpu_export.edge.builder import type_names as tflite_type_names

__all__ = ["TensorView", "OpView", "read_ops"]

_SMALL_CONST_BYTES = 256


@dataclasses.dataclass(frozen=True)
class TensorView:
    name: str
    dtype: str  # schema TensorType name, lower case: "float32", "int8", ...
    shape: tuple
    is_const: bool  # a constant buffer, or float16 weights dequantized once (see read_ops)
    values: tuple | None = None  # the data of a small constant int32 tensor (axes, paddings, shapes)


@dataclasses.dataclass(frozen=True)
class OpView:
    subgraph: int
    index: int
    name: str  # BuiltinOperator name, e.g. "CONV_2D"; "CUSTOM:<code>" for custom ops
    version: int
    inputs: tuple  # TensorView, or None for an omitted optional input (-1)
    outputs: tuple
    options: object  # the builtin <Kind>OptionsT, or None
    fp16_weights: bool = False  # a DEQUANTIZE of constant float16 weights (see read_ops)

    @property
    def runtime_inputs(self) -> list:
        """Inputs computed at run time (not constants, not omitted): the delegates' count."""
        return [t for t in self.inputs if t is not None and not t.is_const]

    @property
    def const_inputs(self) -> list:
        return [t for t in self.inputs if t is not None and t.is_const]

    def option(self, field: str, default=None):
        return getattr(self.options, field, default) if self.options is not None else default


def _schema():
    from ai_edge_litert import schema_py_generated

    return schema_py_generated


def read_ops(tflite: bytes) -> list[OpView]:
    """Every operator of every subgraph, in execution order.

    A DEQUANTIZE of a constant float16 tensor (float16 weights) is flagged ``fp16_weights`` and its
    output counts as constant: the delegates' partition helpers take such nodes and feed the float16
    constants to their consumers directly (GPU and Metal: GraphWithDequantPartitionHelper in
    tensorflow/lite/delegates/gpu/common/model_builder.cc; Core ML: FP16GraphPartitionHelper,
    tensorflow/lite/delegates/utils.h, used in coreml_delegate.mm).
    """
    s = _schema()
    model = s.Model.GetRootAs(tflite, 0)
    op_names = builtin_names()
    type_names = tflite_type_names()
    codes = []
    for i in range(model.OperatorCodesLength()):
        oc = model.OperatorCodes(i)
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())  # codes >127 live only in BuiltinCode
        name = op_names.get(code, f"BUILTIN_{code}")
        if name == "CUSTOM":
            name = f"CUSTOM:{(oc.CustomCode() or b'').decode()}"
        codes.append((name, oc.Version()))

    def small_int32(buffer_index: int, dtype: str):
        # Delegates decide some ops on constant operands (reduction axes, paddings): read those only.
        if dtype != "int32" or buffer_index <= 0 or buffer_index >= model.BuffersLength():
            return None
        buf = model.Buffers(buffer_index)
        if not 0 < buf.DataLength() <= _SMALL_CONST_BYTES:
            return None
        return tuple(int(v) for v in buf.DataAsNumpy().view("<i4"))

    def const(buffer_index: int) -> bool:
        if buffer_index <= 0 or buffer_index >= model.BuffersLength():
            return False
        buf = model.Buffers(buffer_index)
        return buf.DataLength() > 0 or buf.Offset() > 1  # Offset: data stored after the flatbuffer (>2 GB)

    ops = []
    for g in range(model.SubgraphsLength()):
        sg = model.Subgraphs(g)

        folded = set()  # outputs of DEQUANTIZE(float16 constant)

        def tensor(i, sg=sg, folded=folded):
            if i < 0:
                return None
            t = sg.Tensors(i)
            dtype = type_names.get(t.Type(), str(t.Type()))
            return TensorView((t.Name() or b"").decode(), dtype,
                              tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else (),
                              const(t.Buffer()) or i in folded, small_int32(t.Buffer(), dtype))

        for k in range(sg.OperatorsLength()):
            op = sg.Operators(k)
            name, version = codes[op.OpcodeIndex()]
            options = s.OperatorT.InitFromObj(op).builtinOptions
            in_idx = [int(i) for i in (op.InputsAsNumpy() if op.InputsLength() else [])]
            out_idx = [int(i) for i in (op.OutputsAsNumpy() if op.OutputsLength() else [])]
            inputs = tuple(tensor(i) for i in in_idx)
            fp16 = (name == "DEQUANTIZE" and len(inputs) == 1 and inputs[0] is not None
                    and inputs[0].is_const and inputs[0].dtype == "float16")
            if fp16:
                folded.update(out_idx)
            ops.append(OpView(g, k, name, version, inputs, tuple(tensor(i) for i in out_idx), options, fp16))
    return ops
