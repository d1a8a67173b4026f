"""The LiteRT Core ML delegate (iOS 12+, Neural Engine on A12+): which builtins it takes.

Source: tensorflow/tensorflow, tensorflow/lite/delegates/coreml/coreml_delegate.mm,
``IsNodeSupportedByDelegate`` (commit 64eff6b): the version rule ("For most ops, only version 1 is
supported": DEPTHWISE_CONV_2D up to 2, FULLY_CONNECTED up to 6), the float32-input rule ("The model
should not be full-integer quantized") and the op switch; the per-op shape rules restate
tensorflow/lite/delegates/coreml/builders/op_validator.cc as the delegate's documentation lists them
(https://www.tensorflow.org/lite/performance/coreml_delegate, "Supported ops"); MEAN follows
builders/pooling_layer_builder.cc ``IsMeanOpSupported``.
"""

from __future__ import annotations

__all__ = ["COREML_OPS", "COREML_MAX_VERSION", "SOURCE", "coreml_common_check"]

SOURCE = ("tensorflow/lite/delegates/coreml/coreml_delegate.mm (IsNodeSupportedByDelegate) and "
          "builders/op_validator.cc; https://www.tensorflow.org/lite/performance/coreml_delegate")

# Highest op version the delegate accepts; every other op: version 1.
COREML_MAX_VERSION = {"DEPTHWISE_CONV_2D": 2, "FULLY_CONNECTED": 6}


def coreml_common_check(op):
    """The two rules applied to every node before the op switch."""
    limit = COREML_MAX_VERSION.get(op.name, 1)
    if op.version > limit:
        return f"version {op.version} > {limit}"
    first = op.inputs[2] if op.name == "TRANSPOSE_CONV" else (op.inputs[0] if op.inputs else None)
    if first is not None and first.dtype != "float32":
        return f"input is {first.dtype}; only float32 (not full-integer) models"
    return None


def _nchw_broadcastable(shape, out):
    # Core ML broadcasts [B,C,H,W] against [B,C,1,1], [B,1,H,W] and [B,1,1,1]; in LiteRT's NHWC that is
    # [B,1,1,C], [B,H,W,1], [B,1,1,1] (or the output's own shape).
    s = (1,) * (4 - len(shape)) + tuple(shape)
    o = (1,) * (4 - len(out)) + tuple(out)
    if len(s) != 4 or len(o) != 4:
        return False
    return s == o or s[1:] == (1, 1, o[3]) or s[1:] == (o[1], o[2], 1) or s[1:] == (1, 1, 1)


def _binary(op):
    out = op.outputs[0].shape
    bad = [t.shape for t in op.inputs if t is not None and not _nchw_broadcastable(t.shape, out)]
    return f"operand shape {bad[0]} does not broadcast in Core ML's layout" if bad else None


def _weights_const(op, idx=(1, 2)):
    for i in idx:
        if i < len(op.inputs) and op.inputs[i] is not None and not op.inputs[i].is_const:
            return "weights and bias must be constant"
    return None


def _concat(op):
    rank = len(op.outputs[0].shape)
    axis = op.option("axis", 0)
    return None if rank == 4 and axis in (3, -1) else "concatenation only along the channel axis of 4-D tensors"


def _fully_connected(op):
    reason = _weights_const(op)
    if reason:
        return reason
    shape = op.inputs[0].shape
    return None if all(d == 1 for d in shape[:-1]) else "single batch only: every input dim but the last must be 1"


def _pad(op):
    if op.name == "MIRROR_PAD" and op.option("mode", 0) != 0:
        return "only REFLECT mirror padding"
    if len(op.inputs[0].shape) != 4:
        return "only 4-D input"
    if len(op.inputs) < 2 or not op.inputs[1].is_const:
        return "padding must be constant"
    pads = op.inputs[1].values
    if pads is not None and (pads[0:2] != (0, 0) or pads[6:8] != (0, 0)):  # [[N],[H],[W],[C]] x (before, after)
        return "padding only along H and W"
    return None


def _mean(op):
    # pooling_layer_builder.cc IsMeanOpSupported: keep_dims, 4-D input, axes within {H, W}.
    if not op.option("keepDims", False):
        return "keep_dims must be true"
    if len(op.inputs[0].shape) != 4:
        return "only 4-D input"
    axes = op.inputs[1].values if len(op.inputs) > 1 and op.inputs[1] is not None else None
    if axes is None or any((a + 4) % 4 not in (1, 2) for a in axes):
        return "must reduce over H and W only"
    return None


def _reshape(op):
    # "Only supported when target Core ML version is 2, not supported when targeting Core ML 3":
    # the delegate defaults to Core ML 3 on iOS 13+.
    return "RESHAPE runs only with coreml_version=2 (the default on iOS 13+ is 3)"


def _pool(op):
    return None if op.option("fusedActivationFunction", 0) == 0 else "fused activation is not supported"


def _softmax(op):
    return None if op.option("beta", 1.0) == 1.0 else "only beta == 1"


def _always(op):
    return None


COREML_OPS = {
    "ADD": _binary,
    "MUL": _binary,
    "AVERAGE_POOL_2D": _pool,
    "MAX_POOL_2D": _pool,
    "CONCATENATION": _concat,
    "CONV_2D": _weights_const,
    "DEPTHWISE_CONV_2D": _weights_const,
    "FULLY_CONNECTED": _fully_connected,
    "HARD_SWISH": _always,
    "LOGISTIC": _always,
    "MIRROR_PAD": _pad,
    "MEAN": _mean,
    "PAD": _pad,
    "PADV2": _pad,
    "RELU": _always,
    "RELU_N1_TO_1": _always,
    "RELU6": _always,
    "RESHAPE": _reshape,
    "RESIZE_BILINEAR": lambda op: None if len(op.inputs[0].shape) == 4 else "only 4-D input",
    "SOFTMAX": _softmax,
    "TANH": _always,
    "TRANSPOSE_CONV": lambda op: _weights_const(op, (1,)),
}
