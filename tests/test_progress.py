"""converter.progress.heartbeat: a long step says it is running, how long it has run, and how it ended."""

import time

import pytest

from tpu_export.converter.progress import heartbeat


def test_heartbeat_says_elapsed_time_then_done():
    lines = []
    with heartbeat(lines.append, "tpu-v6e: AOT-compiling", every=0.05):
        time.sleep(0.32)
    assert lines[0] == "tpu-v6e: AOT-compiling"
    beats = lines[1:-1]
    assert len(beats) >= 3 and all(b.startswith("tpu-v6e: AOT-compiling: ") and b.endswith(" s") for b in beats)
    assert lines[-1].startswith("tpu-v6e: AOT-compiling: done in ") and float(lines[-1].split()[-2]) >= 0.3


def test_heartbeat_says_a_failure_and_lets_the_error_through():
    lines = []
    with pytest.raises(ValueError, match="boom"), heartbeat(lines.append, "export", every=10):
        raise ValueError("boom")
    assert lines[0] == "export" and lines[-1].startswith("export: failed after ")


def test_no_callback_no_thread():
    import threading

    before = threading.active_count()
    with heartbeat(None, "x", every=0.01):
        assert threading.active_count() == before
