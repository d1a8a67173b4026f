"""The shared passes, each small and named, run as a plain list with a verifier between them.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from ..decompositions import KEEP_WHOLE
from ..program import Program, verify_program
from ._util import drop_unused_weights, sync_weights
from .constant_items import fold_constant_items
from .dead_code import remove_dead_code
from .dtype_policy import apply_dtype_policy
from .expert_split import dense_expert_splits
from .fold_batchnorm import fold_batchnorm
from .fold_constants import fold_constants
from .fold_matmul_transpose import fold_matmul_transpose
from .lower_complex import lower_complex
from .masked_index_put import where_masked_writes
from .masked_row_select import select_masked_rows
from .naming import name_tensors
from .pt2e_qdq import fold_pt2e_qdq
from .simplify import drop_redundant_broadcasts, fold_multiply_by_zero_or_one, remove_noop_ops

__all__ = ["SHARED_PASSES", "run_shared_passes", "fold_batchnorm", "fold_matmul_transpose", "fold_constants",
           "remove_dead_code", "apply_dtype_policy", "lower_complex", "name_tensors", "fold_multiply_by_zero_or_one",
           "remove_noop_ops", "drop_redundant_broadcasts", "fold_pt2e_qdq", "select_masked_rows",
           "where_masked_writes", "dense_expert_splits", "fold_constant_items"]

# Order matters:
# - PT2E quantize/dequantize pairs first: constant folding would bake a weight's pair into a float weight and
#   lose its scales.
# - numbers read back from constant tensors (Reformer's position_ids.max().item()) folded next, then rows split
#   per expert by counts read back as ints (JetMoE) to masked sums: the shapes after them are then static for
#   every later pass.
# - complex arithmetic to real pairs first: no later pass (nor backend) meets a complex value, and the dtype
#   policy then narrows a complex128's float64 pairs as any float64.
# - a mask selection that keeps one position per row (BART's <eos> pooling) to a gather before the dtype policy,
#   which narrows the positions it computes; a write through a boolean mask of one value per position
#   (T5Gemma 2's special-token embedding) to a where beside it.
# - x @ W.t() -> linear(x, W) first: before constant folding stores W.t() as a weight of its own, and
#   before BatchNorm folding, which folds into a linear.
# - then BatchNorm folding: it needs the conv -> BN pattern intact and adds folded weights.
# - dtype policy before constant folding, so folded values are computed in the final dtypes
#   (an int64 arange folded first would carry int64 into the weights).
# - constant folding, then dead code: folding leaves the weight-only subgraphs unread.
# - the algebraic clean-ups after folding (a frozen batch norm's scale is a stored constant only once folded);
#   x * 0 leaves a broadcast the next two may remove, and the branch it drops for dead code.
# - naming last, over the final graph.
SHARED_PASSES = [fold_pt2e_qdq, fold_constant_items, dense_expert_splits, lower_complex, select_masked_rows,
                 where_masked_writes, fold_matmul_transpose, fold_batchnorm, apply_dtype_policy, fold_constants,
                 fold_multiply_by_zero_or_one, remove_noop_ops, drop_redundant_broadcasts, remove_dead_code,
                 name_tensors]


def run_shared_passes(prog: Program, passes=SHARED_PASSES, *, keep=KEEP_WHOLE) -> Program:
    """``keep``: the ops the decomposition kept whole; a pass that writes an op outside it (its
    ``writes`` attribute) is skipped, so a caller that asked for linear decomposed gets no linear back."""
    for p in passes:
        if not set(getattr(p, "writes", ())) <= set(keep):
            continue
        p(prog)
        # Passes add and orphan weights; keep placeholders, weight_names and weights in step.
        for sig in prog.signatures.values():
            sync_weights(prog, sig, recompile=False)
        drop_unused_weights(prog)
        verify_program(prog, p.__name__)
    for sig in prog.signatures.values():
        sig.graph_module.recompile()  # once: the passes work on the graph, not on the generated code
    return prog
