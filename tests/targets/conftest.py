"""Shared fixtures: the zoo's small CNN and transformer encoder, captured once per session."""

from __future__ import annotations

import pytest
import torch

from tests.zoo import build


def _prepared(name):
    from tpu_export import converter

    module, args = build(name)
    prog = converter.prepare(module, args)
    with torch.no_grad():
        ref = module(*args)
    return module, args, prog, ref


@pytest.fixture(scope="session")
def cnn():
    """mobilenet_v2: (module, args, Program, torch eager output)."""
    return _prepared("mobilenet_v2")


@pytest.fixture(scope="session")
def encoder():
    """bert: (module, args, Program, torch eager outputs (sequence, pooled))."""
    return _prepared("bert")
