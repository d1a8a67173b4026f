"""The LiteRT GPU delegate (Android: OpenCL/OpenGL; the iOS Metal delegate shares it): which builtins it takes.

Source: tensorflow/tensorflow, tensorflow/lite/tools/versioning/gpu_compatibility.cc,
``CheckGpuDelegateCompatibility(const OpSignature&)`` (commit 057f8c8), which the GPU delegate's
model_builder.cc calls for every node ("Logics here used to be in TFLiteOperationParser::IsSupported()
of tensorflow/lite/delegates/gpu/common/model_builder.cc"). Each entry below restates one ``case``
of that switch: the op's name -> a check returning None (runs on the GPU) or the reason it falls back.
An op absent from the table is "Not supported op" there. The delegate checks no op versions.
"""

from __future__ import annotations

__all__ = ["GPU_OPS", "SOURCE"]

SOURCE = ("tensorflow/lite/tools/versioning/gpu_compatibility.cc (CheckGpuDelegateCompatibility), "
          "used by tensorflow/lite/delegates/gpu/common/model_builder.cc")

# FusedActivationFunctionType values (schema): NONE 0, RELU 1, RELU_N1_TO_1 2, RELU6 3, TANH 4, SIGN_BIT 5.
_SIGN_BIT = 5
_FLOAT = ("float32", "float16")


def _activation(op, field="fusedActivationFunction"):
    if op.option(field, 0) == _SIGN_BIT:
        return "fused activation SIGN_BIT is not supported"
    return None


def _io(op, runtime_inputs, outputs=1):
    # CheckInputsOutputs: exact counts of runtime (non-constant, present) inputs and of outputs.
    if len(op.runtime_inputs) != runtime_inputs:
        return f"expects {runtime_inputs} runtime input(s), has {len(op.runtime_inputs)}"
    if len(op.outputs) != outputs:
        return f"expects {outputs} output(s), has {len(op.outputs)}"
    return None


def _io_const(op, runtime_inputs, const_inputs, outputs=1):
    # CheckInputsConstsOutputs
    if len(op.const_inputs) != const_inputs:
        return f"expects {const_inputs} constant input(s), has {len(op.const_inputs)}"
    return _io(op, runtime_inputs, outputs)


def _one_or_two_operands(op):
    if _io_const(op, 2, 0) and _io_const(op, 1, 1):
        return "can only handle 1 or 2 operand(s)"
    return None


def _first(*reasons):
    return next((r for r in reasons if r), None)


def _conv(op):
    if len(op.runtime_inputs) > 2 or len(op.outputs) != 1:  # CheckConvoultionInputOutput
        return "expects 1 or 2 runtime inputs and 1 output"
    if min(op.option("strideH", 1), op.option("strideW", 1), op.option("dilationHFactor", 1),
           op.option("dilationWFactor", 1)) <= 0:
        return "stride and dilation must be > 0"
    return _activation(op)


def _depthwise(op):
    reason = _conv(op)
    if reason:
        return reason
    inp, flt, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if len(inp.shape) != 4 or len(flt.shape) != 4 or len(out.shape) != 4:
        return "input, filter and output must be 4-D"
    mult = op.option("depthMultiplier", 1)
    if mult != 1 and inp.shape[3] != 1:
        return "depth_multiplier != 1 && input.c != 1"
    return None


def _pool(op):
    if op.option("filterHeight", 1) <= 0 or op.option("filterWidth", 1) <= 0:
        return "kernel must be > 0"
    return _first(_io(op, 1), _activation(op))


def _axes_const(op, idx=1):
    # CheckAxesAreInt32Const
    axes = op.inputs[idx] if len(op.inputs) > idx else None
    if axes is None or not axes.is_const:
        return f"{op.name} is only supported with constant axes"
    if axes.dtype != "int32":
        return f"{op.name} supports int32 axes only, has {axes.dtype}"
    return None


def _cast(op):
    reason = _io(op, 1)
    if reason:
        return reason
    src, dst = op.inputs[0].dtype, op.outputs[0].dtype
    ok = ((src == "bool" and dst in _FLOAT) or (src in _FLOAT and dst == "bool")
          or (src in ("float32", "int32") and dst in ("float32", "int32")))
    return None if ok else f"CAST {src} -> {dst} is not supported"


def _fully_connected(op):
    if op.option("weightsFormat", 0) != 0:
        return "only the default weights format"
    if len(op.runtime_inputs) > 2:
        return "more than 2 runtime inputs"
    if op.inputs[0].is_const:
        return "constant input is not supported"
    if op.option("keepNumDims", False) and len(op.inputs[0].shape) != len(op.outputs[0].shape):
        return "keep_num_dims with different input and output ranks"
    return None


def _gather(op):
    reason = _one_or_two_operands(op)
    if reason:
        return reason
    if op.inputs[0].dtype == "int32":
        return "int32 params are not accepted"
    if len(op.inputs[1].shape) != 1:
        return "only 1-D indices"
    return None if op.inputs[1].dtype == "int32" else "only int32 indices"


def _mul(op):
    if len(op.inputs) != 2:
        return "MUL requires two input tensors"
    a, b = op.inputs[0].shape, op.inputs[1].shape
    if len(a) == len(b) and any(x < y for x, y in zip(a, b)) and any(y < x for x, y in zip(a, b)):
        return "MUL requires one input not smaller than the other in every dimension"
    return _activation(op)


def _pad(op):
    if op.name == "MIRROR_PAD" and op.option("mode", 0) != 0:  # MirrorPadMode REFLECT = 0
        return "only REFLECT mirror padding"
    reason = _io(op, 1)
    if reason:
        return reason
    pads = op.inputs[1].shape if len(op.inputs) > 1 and op.inputs[1] is not None else ()
    if len(pads) != 2 or pads[0] not in (3, 4) or pads[1] != 2:
        return f"paddings must be 4x2 or 3x2, got {'x'.join(map(str, pads))}"
    return None


def _rank_3_or_4(op, what):
    return None if len(op.inputs[0].shape) in (3, 4) else f"{what} supports 3-D or 4-D tensors only"


def _slice(op):
    return "SLICE requires 3 inputs" if len(op.inputs) < 3 else _rank_3_or_4(op, "SLICE")


def _strided_slice(op):
    for mask in ("ellipsisMask", "newAxisMask", "shrinkAxisMask"):
        if op.option(mask, 0):
            return f"{mask} is not supported"
    if len(op.inputs) < 4:
        return "STRIDED_SLICE requires 4 inputs"
    return _rank_3_or_4(op, "STRIDED_SLICE")


def _block_size(op):
    reason = _io(op, 1)
    if reason:
        return reason
    return None if op.option("blockSize", 2) > 1 else "block_size must be > 1"


def _resize_bilinear(op):
    reason = _io(op, 1)
    if reason:
        return reason
    if op.option("alignCorners", False) and op.option("halfPixelCenters", False):
        return "align_corners and half_pixel_centers together"
    return None


def _select(op):
    if len(op.inputs) != 3 or len(op.outputs) != 1:
        return "expects 3 inputs and 1 output"
    if op.inputs[0].dtype not in ("bool",) + _FLOAT or any(t.dtype not in _FLOAT for t in op.inputs[1:]):
        return "cond must be bool or float, if/else must be float"
    return None


def _softmax(op):
    return None if op.option("beta", 1.0) == 1.0 else "Softmax.beta != 1 is not supported"


def _dequantize(op):
    return "int16 dequantization is not supported" if op.inputs[0].dtype == "int16" else None


def _always(op):
    return None


_UNARY = ("ABS", "COS", "ELU", "EXP", "FLOOR", "GELU", "LOG", "LOGISTIC", "NEG", "RSQRT", "SIGN", "SIN",
          "SQRT", "SQUARE", "TANH")
_BINARY = ("DIV", "EQUAL", "FLOOR_DIV", "FLOOR_MOD", "GREATER", "GREATER_EQUAL", "LOGICAL_AND", "LESS",
           "LESS_EQUAL", "MAXIMUM", "MINIMUM", "NOT_EQUAL", "POW", "SQUARED_DIFFERENCE", "SUB")

GPU_OPS = {
    "ADD": lambda op: _first("ADD requires two input tensors" if len(op.inputs) != 2 else None, _activation(op)),
    "ADD_N": lambda op: None if len(op.inputs) == 2 else "ADD_N only supports 2 inputs",
    "AVERAGE_POOL_2D": _pool,
    "MAX_POOL_2D": _pool,
    "BATCH_MATMUL": lambda op: None if len(op.inputs) == 2 and len(op.outputs) == 1 else "expects 2 inputs, 1 output",
    "CAST": _cast,
    "CONCATENATION": _always,
    "CONV_2D": _conv,
    "DEPTHWISE_CONV_2D": _depthwise,
    "DEPTH_TO_SPACE": _block_size,
    "SPACE_TO_DEPTH": _block_size,
    "DEQUANTIZE": _dequantize,
    "FULLY_CONNECTED": _fully_connected,
    "GATHER": _gather,
    "HARD_SWISH": lambda op: _io(op, 1),
    "MEAN": lambda op: _first(_io_const(op, 1, 1), _axes_const(op)),
    "MUL": _mul,
    "PACK": _always,
    "PRELU": _always,
    "QUANTIZE": lambda op: _io(op, 1),
    "RELU": _always,
    "RELU6": _always,
    "RELU_N1_TO_1": _always,
    "LEAKY_RELU": _always,
    "RESHAPE": lambda op: _io(op, 1),
    "RESIZE_BILINEAR": _resize_bilinear,
    "RESIZE_NEAREST_NEIGHBOR": lambda op: _io(op, 1),
    "SELECT": _select,
    "SELECT_V2": _select,
    "SLICE": _slice,
    "SOFTMAX": _softmax,
    "SPLIT": _always,
    "SPLIT_V": _always,
    "STRIDED_SLICE": _strided_slice,
    "TILE": lambda op: _io(op, 1),
    "TRANSPOSE": lambda op: _io(op, 1),
    "TRANSPOSE_CONV": lambda op: None if min(op.option("strideH", 1), op.option("strideW", 1)) > 0 else "stride <= 0",
    "REDUCE_MAX": lambda op: _first(_io(op, 1), _axes_const(op)),
    "REDUCE_MIN": lambda op: _first(_io(op, 1), _axes_const(op)),
    "REDUCE_PROD": lambda op: _first(_io(op, 1), _axes_const(op)),
    "SUM": lambda op: _first(_io(op, 1), _axes_const(op)),
    "PAD": _pad,
    "PADV2": _pad,
    "MIRROR_PAD": _pad,
    **{name: (lambda op: _io_const(op, 1, 0)) for name in _UNARY},
    **{name: (lambda op: _first(_one_or_two_operands(op), _activation(op))) for name in _BINARY},
}
