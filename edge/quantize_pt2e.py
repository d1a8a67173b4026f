"""A PT2E-quantized model's int8 kernels: the lowered float subgraph rewritten with the observed ranges.

converter/passes/pt2e_qdq.py leaves the float graph with each observed value's scale and zero point on its node
(``meta["pt2e_qparams"]``) and each quantized weight on the int8 grid with its scales. After a signature is
lowered, ``int8_from_pt2e`` turns the LiteRT subgraph into what the TFLite converter makes of a QDQ model:

- An op whose kernel runs int8 (``INT8_KERNELS``) and whose float activations (inputs and outputs) all carry
  ranges runs int8: its activations become int8 tensors with exactly the observed scale / zero point, its
  weight int8 with the observer's per-channel (or per-tensor) scales, its bias int32 at input scale x weight
  scale. Ops that move data (RESHAPE, TRANSPOSE, PAD, MAX_POOL_2D, RELU...) pass a range to the tensors the
  lowering added around an annotated value (an NHWC transpose, a fused RELU's input).
- A FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D with a quantized weight but float activations (the dynamic
  configuration) stores the weight int8 and runs LiteRT's dynamic-range kernel.
- QUANTIZE is inserted where a float value enters int8 ops (the float inputs), DEQUANTIZE where an int8 value
  leaves them (the outputs, a float op's input).
- An op that reads or writes a quantized value but has no int8 kernel here, or whose ranges break its
  kernel's rule (MAX_POOL_2D and CONCATENATION keep their input's range, LOGISTIC / SOFTMAX output 1/256), stays
  float between a DEQUANTIZE and a QUANTIZE and is named in the report (a warning, and the file's
  ``tpu_export.pt2e`` metadata): never a silent float op in place of an int8 one.

``io_int8=True`` (the iot target) makes the inputs and outputs themselves int8 (no boundary QUANTIZE /
DEQUANTIZE) and refuses, naming it, any input, output or op left float.
"""

from __future__ import annotations

import collections
import json
import warnings

import numpy as np

from .builder import NP_DTYPE, TENSOR_TYPE, _Spilled, builtin_names, schema

__all__ = ["int8_from_pt2e", "drop_unused_buffers", "Pt2eFloatOpsWarning", "PT2E_METADATA", "INT8_KERNELS"]

PT2E_METADATA = "tpu_export.pt2e"

# op -> the version its int8 kernel is registered under
INT8_KERNELS = {
    "CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 4, "ADD": 2, "SUB": 2, "MUL": 2, "MEAN": 2,
    "AVERAGE_POOL_2D": 2, "MAX_POOL_2D": 2, "RESHAPE": 1, "TRANSPOSE": 2, "SQUEEZE": 1, "EXPAND_DIMS": 1,
    "PAD": 2, "PADV2": 2, "CONCATENATION": 2, "SLICE": 2, "STRIDED_SLICE": 2, "RELU": 2, "RELU6": 2, "LOGISTIC": 2,
    "SOFTMAX": 2, "TANH": 2, "GATHER": 2, "BATCH_MATMUL": 2,
}
# ops whose output is their first input's values moved or clipped: the range passes through both ways
_SAME_RANGE = {"RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS", "PAD", "PADV2", "MAX_POOL_2D", "SLICE",
               "STRIDED_SLICE", "RELU", "RELU6", "GATHER"}
# ops whose int8 kernel needs the output range equal to the (every) input's
_KEEP_RANGE = _SAME_RANGE | {"CONCATENATION", "AVERAGE_POOL_2D"}
# ops whose int8 kernel has a fixed output range (scale, zero point)
_FIXED_RANGE = {"LOGISTIC": (1 / 256, -128), "SOFTMAX": (1 / 256, -128), "TANH": (1 / 128, 0)}
_WEIGHTED = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0}  # op -> the weight's output-channel axis
_HYBRID_VERSION = {"CONV_2D": 2, "DEPTHWISE_CONV_2D": 6, "FULLY_CONNECTED": 9}
_INT8, _INT32, _FLOAT32 = TENSOR_TYPE["int8"], TENSOR_TYPE["int32"], TENSOR_TYPE["float32"]


class Pt2eFloatOpsWarning(UserWarning):
    """Ops of a PT2E-quantized model that read or write quantized values but run float (no int8 kernel, or
    ranges their int8 kernel does not take): named, with what they run between."""


class _Range:
    """Per-tensor (scale, zero point) of an activation; ``scales`` / ``axis`` for a per-channel weight."""

    __slots__ = ("scale", "zero_point", "scales", "axis")

    def __init__(self, scale, zero_point, scales=None, axis=None):
        self.scale, self.zero_point, self.scales, self.axis = scale, zero_point, scales, axis

    def same(self, other) -> bool:
        return (other is not None and np.isclose(self.scale, other.scale, rtol=1e-6, atol=0)
                and self.zero_point == other.zero_point)


def _qp_of(qp):
    """converter QParams -> _Range (activations: int8 only; others are refused by the caller)."""
    if qp.axis is None:
        return _Range(float(qp.scale), int(qp.zero_point))
    return _Range(None, 0, np.asarray(qp.scale, np.float64), qp.axis)


def _const(model, sg, t) -> np.ndarray | None:
    tensor = sg.tensors[t]
    if not tensor.buffer:
        return None
    data = model.buffers[tensor.buffer].data
    if data is None:
        return None
    raw = b"".join(data.chunks()) if isinstance(data, _Spilled) else bytes(data)
    return np.frombuffer(raw, NP_DTYPE[tensor.type]).reshape(tuple(tensor.shape))


def _quant_params(scales, zero_points, axis=0):
    s = schema()
    q = s.QuantizationParametersT()
    q.scale = [float(x) for x in np.atleast_1d(scales)]
    q.zeroPoint = [int(z) for z in np.atleast_1d(zero_points)]
    q.quantizedDimension = int(axis)
    return q


class _Rewrite:
    def __init__(self, lw, io_int8: bool):
        self.lw, self.model, self.sg = lw, lw.model, lw.sg
        self.io_int8 = io_int8
        self.names = builtin_names()
        self.ranges: dict[int, _Range] = {}  # activation tensor -> range
        self.weights: dict[int, _Range] = {}  # constant tensor -> per-channel / per-tensor weight range
        self.rounded_in: dict[int, int] = {}  # float input of a kept-float op -> its values on the int8 grid
        self.requant = set(getattr(lw, "pt2e_requant", ()))  # RESHAPE outputs that requantize their input
        for qp, v in lw.pt2e_values:
            if qp.dtype != "int8":
                raise ValueError(f"edge: a PT2E value quantized as {qp.dtype}; LiteRT's kernels here take int8 "
                                 "(use get_symmetric_quantization_config)")
            r = _qp_of(qp)
            if v.is_const:
                for perm, t in v.layouts.items():
                    self.weights[t] = _Range(None, 0, r.scales if r.scales is not None else np.array([r.scale]),
                                             tuple(perm).index(r.axis) if r.axis is not None else None)
            elif v.tensor is not None and r.axis is None and v.pending_affine is None:
                self.ranges.setdefault(v.tensor, r)
                for t in v.layouts.values():  # the same value in another layout: the same range
                    self.ranges.setdefault(t, r)

    def code(self, op) -> str:
        return self.names[self.model.builtin_code(op.opcodeIndex)]

    def is_float_act(self, t) -> bool:
        return t >= 0 and self.sg.tensors[t].type == _FLOAT32 and not self.sg.tensors[t].buffer

    # -------------------------------------------------------------------------------- ranges through moves
    def propagate(self) -> None:
        changed = True
        while changed:
            changed = False
            for op in self.sg.operators:
                if self.code(op) not in _SAME_RANGE or not op.inputs or not op.outputs or op.outputs[0] in self.requant:
                    continue
                a, b = op.inputs[0], op.outputs[0]
                if not (self.is_float_act(a) and self.is_float_act(b)):
                    continue
                if a in self.ranges and b not in self.ranges:
                    self.ranges[b] = self.ranges[a]
                    changed = True
                elif b in self.ranges and a not in self.ranges:
                    self.ranges[a] = self.ranges[b]
                    changed = True

    # -------------------------------------------------------------------------------- which ops run int8
    def classify(self, op) -> str:
        """"int8", "hybrid", "float" (every activation quantized, yet no int8 kernel here: reported) or "plain"
        (not all its activations quantized: a float op of the PT2E model too)."""
        code = self.code(op)
        if code == "RESHAPE" and op.outputs[0] in self.requant and op.inputs[0] in self.ranges \
                and op.outputs[0] in self.ranges:
            return "requant"
        acts_in = [t for t in op.inputs if self.is_float_act(t)]
        acts_out = [t for t in op.outputs if self.is_float_act(t)]
        if code in _WEIGHTED and len(op.inputs) > 1 and op.inputs[1] in self.weights:
            bias_ok = len(op.inputs) < 3 or op.inputs[2] < 0 or bool(self.sg.tensors[op.inputs[2]].buffer)
            acts_in = [t for t in acts_in if t != op.inputs[1]]
            if all(t in self.ranges for t in acts_in + acts_out) and acts_in and bias_ok:
                return "int8"
            if not any(t in self.ranges for t in acts_in):
                return "hybrid"
            return "float"
        if not acts_out or not all(t in self.ranges for t in acts_in + acts_out):
            # at the edge of a quantized region (a float op of the PT2E model too): float, DEQUANTIZE before it
            return "plain"
        if code not in INT8_KERNELS or code in _WEIGHTED:
            return "float"
        if any(self.sg.tensors[t].type == _FLOAT32 and self.sg.tensors[t].buffer for t in op.inputs if t >= 0) \
                and code not in ("ADD", "SUB", "MUL", "PADV2"):  # a constant operand: int8 (PADV2: its value)
            return "float"
        out = self.ranges[acts_out[0]]
        if code in _KEEP_RANGE and not all(self.ranges[t].same(out) for t in acts_in):
            return "float"
        if code in _FIXED_RANGE and not out.same(_Range(*_FIXED_RANGE[code])):
            return "float"
        return "int8"

    # -------------------------------------------------------------------------------- tensors
    def twin(self, t, cache) -> int:
        """The int8 tensor standing for float activation ``t`` (created once)."""
        if t not in cache:
            src = self.sg.tensors[t]
            r = self.ranges[t]
            i = self.sg.tensor(src.name + ";int8", list(src.shape), np.int8)
            self.sg.tensors[i].shapeSignature = src.shapeSignature
            self.sg.tensors[i].quantization = _quant_params(r.scale, r.zero_point)
            cache[t] = i
        return cache[t]

    def qconst(self, array, name, scales, zero_points, axis, dtype) -> int:
        i = self.sg.const(np.ascontiguousarray(array.astype(dtype)), name)
        self.sg.tensors[i].quantization = _quant_params(scales, zero_points, axis)
        return i

    def weight(self, op, code) -> tuple[int, np.ndarray]:
        """The int8 weight tensor of weighted ``op`` and its per-channel scales."""
        t = op.inputs[1]
        w = _const(self.model, self.sg, t).astype(np.float64)
        r = self.weights[t]
        axis = r.axis if r.axis is not None else _WEIGHTED[code]
        scales = r.scales if len(r.scales) == w.shape[axis] or len(r.scales) == 1 else None
        if scales is None:
            raise ValueError(f"edge: {self.sg.tensors[t].name}: {len(r.scales)} scales for {w.shape[axis]} channels")
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.round(w / scales.reshape(shape) if len(scales) > 1 else w / scales[0]), -127, 127)
        return self.qconst(q, self.sg.tensors[t].name + ";int8", scales, np.zeros(len(scales), np.int64),
                           axis if len(scales) > 1 else 0, np.int8), scales

    def bias(self, op, in_scale, w_scales) -> int | None:
        if len(op.inputs) < 3 or op.inputs[2] < 0:
            return None
        b = _const(self.model, self.sg, op.inputs[2])
        if b is None:
            return None
        scales = in_scale * w_scales
        q = np.clip(np.round(b.astype(np.float64) / (scales if len(scales) > 1 else scales[0])), -2**31, 2**31 - 1)
        return self.qconst(q, self.sg.tensors[op.inputs[2]].name + ";int32", scales, np.zeros(len(scales), np.int64),
                           0, np.int32)

    def const_in_range(self, t, r: _Range) -> int:
        c = _const(self.model, self.sg, t).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            q = np.clip(np.nan_to_num(np.round(c / r.scale), posinf=127, neginf=-128) + r.zero_point, -128, 127)
        return self.qconst(q, self.sg.tensors[t].name + ";int8", [r.scale], [r.zero_point], 0, np.int8)

    def const_operand(self, t) -> int:
        """A float constant read by an int8 ADD / MUL / ...: per-tensor int8 over its own range (0 included)."""
        c = _const(self.model, self.sg, t).astype(np.float64)
        lo, hi = min(float(c.min()), 0.0), max(float(c.max()), 0.0)
        scale = max((hi - lo) / 255.0, 1e-12)
        zp = int(np.clip(np.round(-128 - lo / scale), -128, 127))
        q = np.clip(np.round(c / scale) + zp, -128, 127)
        return self.qconst(q, self.sg.tensors[t].name + ";int8", [scale], [zp], 0, np.int8)

    # -------------------------------------------------------------------------------- the rewrite
    def run(self) -> dict:
        self.propagate()
        sg = self.sg
        kinds = [self.classify(op) for op in sg.operators]
        producer = {}
        for k, op in enumerate(sg.operators):
            for t in op.outputs:
                producer[t] = k
        twins: dict[int, int] = {}
        need_quant, need_dequant = set(), set()  # float tensors feeding int8 ops / int8 outputs read as float
        int8_written = set()
        rounded = {}  # float tensor -> the float tensor of its values on the int8 grid (QUANTIZE + DEQUANTIZE)
        extra = collections.defaultdict(list)  # op index -> ops to place right after it (-1: before all)
        report = {"int8": collections.Counter(), "hybrid": collections.Counter(), "float": collections.Counter()}
        float_names = []
        for k, (op, kind) in enumerate(zip(sg.operators, kinds)):
            code = self.code(op)
            if kind == "float":
                report["float"][code] += 1
                float_names.append(f"{code} ({sg.tensors[op.outputs[0]].name})")
                self.round_float_op(k, op, twins, rounded, extra, producer, int8_written)
            if kind == "hybrid":
                op.inputs[1] = self.weight(op, code)[0]
                if code == "FULLY_CONNECTED":
                    op.builtinOptions.asymmetricQuantizeInputs = True
                op.opcodeIndex = self.model.opcode(self.model.builtin_code(op.opcodeIndex), _HYBRID_VERSION[code])
                report["hybrid"][code] += 1
                continue
            if kind == "requant":  # int8 -> int8 at the second range
                src, out = op.inputs[0], op.outputs[0]
                op.inputs, op.outputs = [self.twin(src, twins)], [self.twin(out, twins)]
                if src not in int8_written:
                    need_quant.add(src)
                int8_written.add(out)
                op.opcodeIndex = self.model.opcode(schema().BuiltinOperator.QUANTIZE, 2)
                op.builtinOptionsType, op.builtinOptions = 0, None
                report["int8"]["QUANTIZE"] += 1
                continue
            if kind != "int8":
                continue
            report["int8"][code] += 1
            ins = list(op.inputs)
            if code in _WEIGHTED:
                in_scale = self.ranges[ins[0]].scale
                ins[1], w_scales = self.weight(op, code)
                b = self.bias(op, in_scale, w_scales)
                if b is not None:
                    ins[2] = b
            for j, t in enumerate(op.inputs):
                if t < 0 or (code in _WEIGHTED and j in (1, 2)):
                    continue
                tensor = sg.tensors[t]
                if tensor.type == _FLOAT32 and tensor.buffer and code == "PADV2":
                    # the pad value in the input's range (a max pool's -inf padding: the lowest int8)
                    ins[j] = self.const_in_range(t, self.ranges[op.inputs[0]])
                elif tensor.type == _FLOAT32 and tensor.buffer:
                    ins[j] = self.const_operand(t)
                elif self.is_float_act(t):
                    ins[j] = self.twin(t, twins)
                    if t not in int8_written:
                        need_quant.add(t)
            op.inputs = ins
            outs = list(op.outputs)
            for j, t in enumerate(op.outputs):
                if self.is_float_act(t):
                    outs[j] = self.twin(t, twins)
                    int8_written.add(t)
            op.outputs = outs
            op.opcodeIndex = self.model.opcode(self.model.builtin_code(op.opcodeIndex), INT8_KERNELS[code])
        need_quant -= int8_written | set(rounded)
        # a float reader (or the signature's output) of a value an int8 op wrote reads its DEQUANTIZE
        for op, kind in zip(sg.operators, kinds):
            if kind not in ("int8", "requant"):
                need_dequant.update(t for t in op.inputs if t in int8_written)
        need_dequant.update(t for t in sg.outputs if t in int8_written)
        self.insert(producer, twins, need_quant, need_dequant, extra)
        if self.io_int8:
            self.int8_io(twins, float_names, report)
        return {k: dict(v) for k, v in report.items()} | {"float_ops": float_names}

    def qdq(self, code: str, src: int, dst: int):
        s = schema()
        o = s.OperatorT()
        builtin = getattr(s.BuiltinOperator, code)
        o.opcodeIndex, o.inputs, o.outputs = self.model.opcode(builtin, 1 if code == "QUANTIZE" else 2), [src], [dst]
        return o

    def round_float_op(self, k, op, twins, rounded, extra, producer, int8_written) -> None:
        """An op kept float inside a quantized region computes what torch's converted model does: on inputs
        rounded to their int8 grid (DEQUANTIZE of the int8 value), its output rounded (QUANTIZE, DEQUANTIZE)
        before any reader sees it."""
        ins = list(op.inputs)
        for j, t in enumerate(op.inputs):
            if not self.is_float_act(t) or t not in self.ranges or t in rounded or t in int8_written:
                continue  # (an int8 op's output is read through its DEQUANTIZE: on the grid already)
            if t not in self.rounded_in:
                t8 = self.twin(t, twins)
                r = self.sg.tensor(self.sg.tensors[t].name + ";rounded", list(self.sg.tensors[t].shape), np.float32)
                self.sg.tensors[r].shapeSignature = self.sg.tensors[t].shapeSignature
                extra[producer.get(t, -1)].append(("in", t, self.qdq("QUANTIZE", t, t8),
                                                   self.qdq("DEQUANTIZE", t8, r)))
                self.rounded_in[t] = r
            ins[j] = self.rounded_in[t]
        op.inputs = ins
        outs = list(op.outputs)
        for j, t in enumerate(op.outputs):
            if not self.is_float_act(t) or t not in self.ranges:
                continue
            raw = self.sg.tensor(self.sg.tensors[t].name + ";float", list(self.sg.tensors[t].shape), np.float32)
            self.sg.tensors[raw].shapeSignature = self.sg.tensors[t].shapeSignature
            t8 = self.twin(t, twins)
            extra[k].append(("out", t, self.qdq("QUANTIZE", raw, t8), self.qdq("DEQUANTIZE", t8, t)))
            rounded[t] = t
            outs[j] = raw
        op.outputs = outs

    def insert(self, producer, twins, need_quant, need_dequant, extra) -> None:
        sg = self.sg
        after = collections.defaultdict(list)
        for k, items in extra.items():
            for kind, t, q, dq in items:
                if kind == "out" or t not in need_quant:  # else the int8 readers' QUANTIZE serves
                    after[k].append(q)
                after[k].append(dq)
        for t in sorted(need_quant):
            after[producer.get(t, -1)].insert(0, self.qdq("QUANTIZE", t, twins[t]))
        for t in sorted(need_dequant):
            after[producer[t]].append(self.qdq("DEQUANTIZE", twins[t], t))
        ops = list(after[-1])
        for k, op in enumerate(sg.operators):
            ops.append(op)
            ops.extend(after[k])
        sg.operators = ops

    def int8_io(self, twins, float_names, report) -> None:
        """Inputs and outputs int8 themselves: the boundary QUANTIZE / DEQUANTIZE go, the float tensor takes
        the int8 type and range (the signature keeps its tensor indices and names)."""
        sg = self.sg
        if float_names:
            raise ValueError(f"a full-integer model (int8 inputs and outputs) cannot keep these ops float: "
                             f"{', '.join(float_names)}; quantize them or use a target that runs float ops")
        hybrid = sum(report["hybrid"].values())
        if hybrid:
            raise ValueError("a full-integer model cannot use dynamic-range kernels (a dynamic PT2E configuration); "
                             "quantize with get_symmetric_quantization_config(is_dynamic=False)")
        codes = {id(op): self.code(op) for op in sg.operators}
        for t in list(sg.inputs) + list(sg.outputs):
            if t not in twins:
                kind = "input" if t in sg.inputs else "output"
                raise ValueError(f"{kind} {sg.tensors[t].name!r} has no int8 range (no quantized op reads or "
                                 "writes it); a full-integer model needs every input and output quantized")
        for t in list(sg.inputs) + list(sg.outputs):
            t8 = twins[t]
            keep = []
            for op in sg.operators:
                boundary = codes[id(op)] in ("QUANTIZE", "DEQUANTIZE") and (
                    (op.inputs == [t] and op.outputs == [t8]) or (op.inputs == [t8] and op.outputs == [t]))
                if boundary:
                    continue
                op.inputs = [t if i == t8 else i for i in op.inputs]
                op.outputs = [t if i == t8 else i for i in op.outputs]
                keep.append(op)
            sg.operators = keep
            sg.tensors[t].type = _INT8
            sg.tensors[t].quantization = sg.tensors[t8].quantization


def _compact(model, sg) -> None:
    """Drop the tensors no operator, input or output refers to any more (the float weights the int8 ones replaced,
    the float activations int8 tensors stand for), renumbering the rest in the operators, the subgraph's inputs
    and outputs and its signature defs."""
    used = set(sg.inputs) | set(sg.outputs)
    for op in sg.operators:
        used.update(t for t in list(op.inputs) + list(op.outputs) if t >= 0)
    keep = [t for t in range(len(sg.tensors)) if t in used]
    if len(keep) == len(sg.tensors):
        return
    new = {old: i for i, old in enumerate(keep)}
    sg.tensors = [sg.tensors[t] for t in keep]
    for op in sg.operators:
        op.inputs = [new[t] if t >= 0 else t for t in op.inputs]
        op.outputs = [new[t] for t in op.outputs]
    sg.inputs, sg.outputs = [new[t] for t in sg.inputs], [new[t] for t in sg.outputs]
    sg._const_tensors = {k: new[t] for k, t in sg._const_tensors.items() if t in new}
    index = model.subgraphs.index(sg)
    for sd in model.signature_defs:
        if sd.subgraphIndex == index:
            for tm in list(sd.inputs) + list(sd.outputs):
                tm.tensorIndex = new[tm.tensorIndex]


def drop_unused_buffers(model) -> None:
    """Empty the buffers no tensor of any subgraph reads (the float weights of a PT2E model, replaced by int8 ones):
    run once every signature is lowered, since a later signature may share a buffer."""
    from .builder import _AlignedBuffer

    used = {t.buffer for sg in model.subgraphs for t in sg.tensors}
    dropped = {i for i in range(1, len(model.buffers)) if i not in used and model.buffers[i].data is not None}
    for i in dropped:
        model.buffers[i] = _AlignedBuffer(None)
    # the builder's by-content caches must not hand an emptied buffer to a later constant of the same bytes
    model._buffer_by_digest = {k: i for k, i in model._buffer_by_digest.items() if i not in dropped}
    model._buffer_by_address = {k: i for k, i in model._buffer_by_address.items() if i not in dropped}
    model._buffer_by_sample = {k: [i for i in v if i not in dropped] for k, v in model._buffer_by_sample.items()}


def int8_from_pt2e(lw, *, io_int8: bool = False) -> dict:
    """Rewrite the subgraph ``lw`` (an edge Lowerer just done with a signature) into int8 kernels from its PT2E
    ranges (see the module docstring). Returns the report: op counts ``int8`` / ``hybrid`` / ``float`` and
    ``float_ops`` (the quantized-region ops kept float, each with its output's name).

    Raises:
        ValueError: ``io_int8`` and an input, output or op that cannot be int8 (named).
    """
    report = _Rewrite(lw, io_int8).run()
    _compact(lw.model, lw.sg)
    if report["float_ops"]:
        warnings.warn(f"PT2E model, signature {lw.sig.name!r}: these ops read or write quantized values but run "
                      f"float (DEQUANTIZE before, QUANTIZE after): {', '.join(report['float_ops'])}",
                      Pt2eFloatOpsWarning, stacklevel=2)
    entries = json.loads(lw.model.metadata.get(PT2E_METADATA, b"{}"))
    entries[lw.sig.name] = report
    lw.model.metadata[PT2E_METADATA] = json.dumps(entries).encode()
    return report
