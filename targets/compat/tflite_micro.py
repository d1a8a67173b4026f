"""TFLite Micro: which builtins its interpreter can run (there is no fallback on a microcontroller).

Source: tensorflow/tflite-micro, python/tflite_micro/python_ops_resolver.cc (commit 85e19dd), the
resolver of the ``tflite-micro`` PyPI interpreter we verify with; each ``Add<Op>()`` there is one
``MicroMutableOpResolver`` registration (tensorflow/lite/micro/micro_mutable_op_resolver.h). TFLite
Micro does not check op versions. Its kernels are written for int8/int16 quantized tensors (float32
reference kernels exist for many ops but are slow on MCUs): the iot target quantizes to int8.
Custom registrations there (CIRCULAR_BUFFER, TFLite_Detection_PostProcess, ETHOSU, signal ops) are
not builtins and are left out.
"""

from __future__ import annotations

__all__ = ["TFLM_OPS", "SOURCE"]

SOURCE = "tensorflow/tflite-micro python/tflite_micro/python_ops_resolver.cc (PythonOpsResolver)"

TFLM_OPS = frozenset({
    "ABS", "ADD", "ADD_N", "ARG_MAX", "ARG_MIN", "ASSIGN_VARIABLE", "AVERAGE_POOL_2D", "BATCH_MATMUL",
    "BATCH_TO_SPACE_ND", "BROADCAST_ARGS", "BROADCAST_TO", "CALL_ONCE", "CAST", "CEIL", "CONCATENATION",
    "CONV_2D", "COS", "CUMSUM", "DEPTH_TO_SPACE", "DEPTHWISE_CONV_2D", "DEQUANTIZE", "DIV", "ELU",
    "EMBEDDING_LOOKUP", "EQUAL", "EXP", "EXPAND_DIMS", "FILL", "FLOOR", "FLOOR_DIV", "FLOOR_MOD",
    "FULLY_CONNECTED", "GATHER", "GATHER_ND", "GREATER", "GREATER_EQUAL", "HARD_SWISH", "IF",
    "L2_NORMALIZATION", "L2_POOL_2D", "LEAKY_RELU", "LESS", "LESS_EQUAL", "LOG", "LOG_SOFTMAX",
    "LOGICAL_AND", "LOGICAL_NOT", "LOGICAL_OR", "LOGISTIC", "MAX_POOL_2D", "MAXIMUM", "MEAN", "MINIMUM",
    "MIRROR_PAD", "MUL", "NEG", "NOT_EQUAL", "PACK", "PAD", "PADV2", "PRELU", "QUANTIZE", "READ_VARIABLE",
    "REDUCE_MAX", "RELU", "RELU6", "RESHAPE", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "ROUND", "RSQRT",
    "SELECT_V2", "SHAPE", "SIN", "SLICE", "SOFTMAX", "SPACE_TO_BATCH_ND", "SPACE_TO_DEPTH", "SPLIT", "SPLIT_V",
    "SQRT", "SQUARE", "SQUARED_DIFFERENCE", "SQUEEZE", "STRIDED_SLICE", "SUB", "SUM", "SVDF", "TANH",
    "TRANSPOSE", "TRANSPOSE_CONV", "UNIDIRECTIONAL_SEQUENCE_LSTM", "UNPACK", "VAR_HANDLE", "WHILE",
    "ZEROS_LIKE",
})
