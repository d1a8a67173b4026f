"""bench/jax_reference: the hand-written JAX models match torch eager on every real-size architecture, in
float32 with full-precision convs and matmuls, and carry every torch weight (BatchNorm folded)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from bench.jax_reference import MODELS, reference
from tests.numerics import rel_err


def _torch_outputs(out) -> list:
    return list(out.to_tuple()) if hasattr(out, "to_tuple") else [out]


def _folded_count(model: torch.nn.Module) -> int:
    """torch's parameter count less one vector per BatchNorm: its gamma and beta fold into the conv's kernel
    scale and one bias (the running statistics are buffers, not parameters)."""
    bn = sum(m.num_features for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    return sum(p.numel() for p in model.parameters()) - bn


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_matches_torch(name):
    from bench.real_models import build_real

    model, args = build_real(name)
    with torch.no_grad():
        want = _torch_outputs(model(*args))
    ref = reference(name, model, args, precision="highest")
    leaves = jax.tree.leaves(ref.params)
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in leaves)
    assert sum(a.size for a in leaves) == _folded_count(model)
    with jax.default_device(jax.devices("cpu")[0]):
        got = ref.outputs_like_torch(jax.jit(ref.fn)(ref.params, *ref.inputs))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        assert rel_err(g, w) <= 1e-4, (name, rel_err(g, w))


def test_unknown_model_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match="densenet121") as err:
        reference("densenet121", torch.nn.Identity(), ())
    assert all(name in str(err.value) for name in MODELS)
