"""The attributes of a layer quantization recipe (litert-torch 0.10's ``quant_attrs`` enums)."""

from __future__ import annotations

import enum

__all__ = ["Dtype", "Algorithm", "Mode", "Granularity"]


@enum.unique
class Dtype(enum.Enum):
    """The data type of a tensor."""

    FP32 = enum.auto()
    FP16 = enum.auto()
    INT8 = enum.auto()
    INT4 = enum.auto()


@enum.unique
class Algorithm(enum.Enum):
    """How the quantization parameters are computed: min/max range, or a cast between float types."""

    MIN_MAX = enum.auto()
    FLOAT_CAST = enum.auto()


@enum.unique
class Mode(enum.Enum):
    """Dynamic range (activations quantized at run time, integer compute) or weight only (float compute)."""

    DYNAMIC_RANGE = enum.auto()
    WEIGHT_ONLY = enum.auto()


@enum.unique
class Granularity(enum.Enum):
    """How many scales a weight has: none (float cast), one per output channel, or one per block of inputs."""

    NONE = enum.auto()
    CHANNELWISE = enum.auto()
    BLOCKWISE_32 = enum.auto()
    BLOCKWISE_64 = enum.auto()
    BLOCKWISE_128 = enum.auto()
    BLOCKWISE_256 = enum.auto()
