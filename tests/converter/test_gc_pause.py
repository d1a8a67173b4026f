"""Conversions pause the cyclic GC (converter/gc_pause.py) and always restore its state."""

import gc

import pytest
import torch

import converter
from converter.gc_pause import gc_paused


def test_paused_inside_restored_after_and_on_error():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: still paused, and the inner exit does not resume it
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_prepare_restores_the_callers_state():
    m, x = torch.nn.Linear(3, 2).eval(), torch.randn(1, 3)
    converter.prepare(m, (x,))
    assert gc.isenabled()
    gc.disable()
    try:
        converter.prepare(m, (x,))
        assert not gc.isenabled()  # a caller that disabled the GC keeps it disabled
    finally:
        gc.enable()
    with pytest.raises(converter.ExportFailedError):
        converter.prepare(m, (torch.randn(1, 4),))  # wrong shape: export fails
    assert gc.isenabled()
