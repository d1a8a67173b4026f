"""Conversions pause the cyclic GC (converter/gc_pause.py) and always restore its state."""

import gc

import pytest
import torch

from tpu_export import converter
from tpu_export.converter.gc_pause import gc_paused


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
            assert gc.get_freeze_count() > 0
            raise RuntimeError("boom")
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_older_objects_sit_out_the_pause_and_are_collected_after():
    class Cycle:
        pass

    def cycle():
        a, b = Cycle(), Cycle()
        a.b, b.a = b, a

    assert gc.get_freeze_count() == 0
    cycle()  # garbage from before the conversion
    with gc_paused():
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # everything older (torch, the tracer) is out of the collector's way
        cycle()  # and garbage the conversion leaves
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, Cycle)]


def test_a_callers_freeze_is_left_alone():
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with gc_paused():
            assert not gc.isenabled()
            assert gc.get_freeze_count() == before
        assert gc.get_freeze_count() == before
        assert gc.isenabled()
    finally:
        gc.unfreeze()


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
