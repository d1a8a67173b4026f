"""Notes for the generated op-support table (docs/ops.md, `tpu-export ops`): how the edge
backend lowers ops LiteRT has no single builtin for, and the forms it accepts."""

from __future__ import annotations

__all__ = ["EDGE_NOTES"]

_STATIC = "static shapes only"

EDGE_NOTES: dict[str, str] = {
    # one-builtin-short ops written as sequences (edge/ops_elementwise.py, ops_logical.py)
    "aten.atan.default": "edge: ATAN2(x, ZEROS_LIKE(x) + 1)",
    "aten.atan2.default": "edge: ATAN2; operands of equal shape (the kernel does not broadcast)",
    "aten.asin.default": "edge: ATAN2(x, SQRT((1-x)(1+x)))",
    "aten.acos.default": "edge: ATAN2(SQRT((1-x)(1+x)), x)",
    "aten.tan.default": "edge: SIN / COS",
    "aten.sinh.default": "edge: (EXP(x) - EXP(-x)) / 2",
    "aten.cosh.default": "edge: (EXP(x) + EXP(-x)) / 2",
    "aten.asinh.default": "edge: SIGN(x) * LOG(|x| + SQRT(x^2 + 1))",
    "aten.acosh.default": "edge: LOG(x + SQRT((x-1)(x+1)))",
    "aten.atanh.default": "edge: LOG((1+x)/(1-x)) / 2",
    "aten.log2.default": "edge: LOG * 1/ln 2",
    "aten.log10.default": "edge: LOG * 1/ln 10",
    "aten.log1p.default": "edge: LOG(x + 1)",
    "aten.expm1.default": "edge: EXP(x) - 1",
    "aten.trunc.default": "edge: SELECT_V2(x < 0, CEIL, FLOOR)",
    "aten.fmod.Tensor": "edge: a - b * trunc(a / b) (DIV, FLOOR/CEIL, SELECT_V2)",
    "aten.fmod.Scalar": "edge: a - b * trunc(a / b) (DIV, FLOOR/CEIL, SELECT_V2)",
    "aten.erf.default": "edge: Abramowitz-Stegun 7.1.26 polynomial (|err| <= 1.5e-7)",
    "aten.isnan.default": "edge: NOT_EQUAL(x, x); float inputs",
    "aten.isinf.default": "edge: EQUAL(ABS(x), inf); float inputs",
    "aten.div.Tensor_mode": "edge: trunc mode as SELECT_V2 of FLOOR/CEIL on floats, FLOOR_DIV of the magnitudes "
                            "times the signs on ints",
    "aten.div.Scalar_mode": "edge: trunc mode as SELECT_V2 of FLOOR/CEIL on floats, FLOOR_DIV of the magnitudes "
                            "times the signs on ints",
    # boolean-only bitwise ops: LiteRT has BITWISE_XOR and RIGHT_SHIFT, no integer AND/OR/NOT
    "aten.bitwise_and.Tensor": "edge: bool only (LOGICAL_AND); no integer AND builtin",
    "aten.bitwise_and.Scalar": "edge: bool only (LOGICAL_AND); no integer AND builtin",
    "aten.bitwise_or.Tensor": "edge: bool only (LOGICAL_OR); no integer OR builtin",
    "aten.bitwise_or.Scalar": "edge: bool only (LOGICAL_OR); no integer OR builtin",
    "aten.bitwise_not.default": "edge: bool only (LOGICAL_NOT); no integer NOT builtin",
    "aten.bitwise_xor.Scalar": "edge: BITWISE_XOR (NOT_EQUAL on bool)",
    "aten.bitwise_xor.Tensor": "edge: BITWISE_XOR (NOT_EQUAL on bool)",
    # scatters (edge/ops_index.py)
    "aten.scatter.src": "edge: SELECT_V2(SCATTER_ND(ones) > 0, SCATTER_ND(src), self); " + _STATIC,
    "aten.scatter.value": "edge: SELECT_V2(SCATTER_ND(ones) > 0, SCATTER_ND(value), self); " + _STATIC,
    "aten.scatter_add.default": "edge: self + SCATTER_ND(src); " + _STATIC,
    "aten.index_put.default": "edge: SCATTER_ND at broadcast coordinates (FLOOR_MOD for negative indices); "
                              "index tensors on consecutive dims after any full slices; " + _STATIC + "; a bool "
                              "mask writing one value to every masked position becomes a where (converter/passes/"
                              "masked_index_put.py), other bool masks are refused",
    "aten.slice_scatter.default": "edge: CONCATENATION(self, src) + GATHER with a constant index; static slice",
    "aten.masked_scatter.default": "edge: CUMSUM(mask) - 1 -> GATHER(source) -> SELECT_V2; " + _STATIC,
    "aten.scatter_reduce.two": "edge: UNSORTED_SEGMENT_{SUM,PROD,MAX,MIN} over flat target ids, combined with self "
                               "(ADD/MUL/MAXIMUM/MINIMUM, DIV for mean) and SELECT_V2 for untouched positions; "
                               "mean on floats only; " + _STATIC,
    # others
    "aten.diagonal.default": "edge: GATHER_ND with constant coordinates; " + _STATIC,
    "aten.native_layer_norm.default": "edge: MEAN, SUB, SQUARE, MEAN, ADD, RSQRT, MUL (+ affine)",
    "aten.native_group_norm.default": "edge: RESHAPE to groups + the layer-norm sequence; " + _STATIC,
    "aten._cdist_forward.default": "edge: SUB of broadcast rows, then SQRT(SUM(SQUARE)) / SUM(ABS) / REDUCE_MAX(ABS); "
                                   "p in (1, 2, inf)",
    "aten.empty.memory_format": "edge: FILL with zeros (contents unspecified)",
    "aten.empty_strided.default": "edge: FILL with zeros (contents unspecified); " + _STATIC,
    "aten.copy.default": "edge: CAST / BROADCAST_TO of src",
    "aten.var.correction": "edge: MEAN, SQUARED_DIFFERENCE, SUM, MUL; " + _STATIC,
    "aten.gather.default": "edge: GATHER_ND with meshgrid coordinates (a dynamic index shape: RANGE + "
                           "BROADCAST_TO coordinates)",
    "aten.slice.Tensor": "edge: SLICE (a step dividing its dim: RESHAPE, SLICE, RESHAPE), else STRIDED_SLICE; "
                         "a dynamic start/end: STRIDED_SLICE with run-time begin/end",
    "aten.arange.start_step": "edge: RANGE (a dynamic bound read at run time)",
    "aten.constant_pad_nd.default": "edge: PAD / PADV2; a negative pad (a crop) on a static dim: SLICE first",
    "aten.elu.default": "edge: ELU; alpha = scale = input_scale = 1",
    "aten.roll.default": "edge: SLICE x2 + CONCATENATION per dim",
    "aten.avg_pool3d.default": "edge: two AVERAGE_POOL_2D (H,W then D) between RESHAPEs; no padding, no ceil_mode, "
                               "no divisor_override",
    "aten.max_pool3d_with_indices.default": "edge: two MAX_POOL_2D (H,W then D) between RESHAPEs; no padding, "
                                            "no ceil_mode, no dilation, indices unused",
    "aten._adaptive_avg_pool3d.default": "edge: as avg_pool3d; output sizes dividing the input sizes",
    "aten.grid_sampler_2d.default": "edge: GATHER_ND per corner (4 bilinear, 1 nearest) weighted and ADD_N'd; "
                                    "bilinear/nearest, zeros/border padding, float32; " + _STATIC,
    "aten.nonzero.default": "data-dependent output shape: neither backend (XLA and LiteRT builtins need static "
                            "or bounded shapes)",
    "aten._local_scalar_dense.default": "data-dependent scalar (.item()): not lowered; the item of a tensor "
                                        "computed from constants alone is folded (converter/passes/"
                                        "constant_items.py), rows split per expert by counts read back with "
                                        ".tolist() (JetMoE) become masked sums (converter/passes/expert_split.py)",
    "aten.sym_size.int": "edge: SHAPE + GATHER, evaluated by the driver (edge/lower.py)",
    "aten.sym_numel.default": "edge: not evaluated by the driver yet (SYM_OPS in edge/lower.py)",
    "aten.sym_stride.int": "strides have no meaning in either runtime; export only writes it for custom views",
    "aten.sym_storage_offset.default": "storage offsets have no meaning in either runtime",
    "aten.sym_is_contiguous.default": "memory-layout query; no meaning in either runtime",
    "aten.col2im.default": "F.fold: decomposes into an accumulating index_put on non-leading dims, which "
                           "neither backend lowers yet",
    "aten._embedding_bag.default": "not lowered yet (nn.EmbeddingBag; embedding + a reduction is the workaround)",
    "aten._pdist_forward.default": "not lowered yet (torch.pdist; cdist is)",
}
