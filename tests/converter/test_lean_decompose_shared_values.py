"""Two nodes of a decomposed graph that hold the same fake value (one cached decomposition spliced in two places)
stay two arguments of the op that reads them (converter.decompositions._distinct): the node-by-node decomposition
of Mamba-2's einsum of C and B, each a repeat_interleave + reshape of the same shape, read B twice before."""

import torch

from tpu_export.converter.capture import capture
from tpu_export.converter.decompositions import KEEP_WHOLE, _plain_table
from tpu_export.converter.lean_decompose import decompose_in_place
from tpu_export.converter.numerics import rel_err

KEEP = frozenset(KEEP_WHOLE)


class _TwoAlike(torch.nn.Module):
    def forward(self, b, c):
        b = b.repeat_interleave(4, dim=2, output_size=8).reshape(1, 2, 8, 8, 16)
        c = c.repeat_interleave(4, dim=2, output_size=8).reshape(1, 2, 8, 8, 16)
        return torch.einsum("bclhn,bcshn->bclsh", c, b)


def test_two_nodes_alike_stay_two_arguments():
    torch.manual_seed(0)
    args = (torch.randn(1, 16, 2, 16), torch.randn(1, 16, 2, 16))
    module = _TwoAlike().eval()
    ep = capture(module, args)
    decompose_in_place(ep, _plain_table(KEEP), KEEP)
    assert all(n.users for n in ep.graph.nodes if n.op == "placeholder")  # both inputs read
    assert rel_err(ep.module()(*args), module(*args)) <= 1e-6
