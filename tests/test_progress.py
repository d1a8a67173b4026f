"""converter.progress.heartbeat: a long step says it is running, how long it has run, and how it ended."""

import re
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


class _Terminal:
    """A text stream that says it is a terminal, as sys.stderr does on one; it keeps what was written."""

    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_cli_progress_redraws_one_status_line_on_a_terminal():
    from tpu_export.cli import _progress

    term = _Terminal(tty=True)
    say = _progress(False, term)
    assert say.every == 1.0
    with heartbeat(say, "tpu-v6e: AOT-compiling", every=0.05):
        time.sleep(0.3)
    say("tpu-v6e: written")
    lines = term.text.split("\n")
    # the step's line, then its beats drawn over each other on one line, cleared before the closing line
    assert lines[0].endswith("] tpu-v6e: AOT-compiling")
    status, done = lines[1].rsplit("\r\033[K", 1)
    assert status.count("\r\033[K") >= 2 and "tpu-v6e: AOT-compiling: " in status
    assert "] tpu-v6e: AOT-compiling: done in " in done
    assert lines[2].endswith("] tpu-v6e: written") and "\r" not in lines[2] and lines[3] == ""


def test_cli_progress_in_a_log_is_a_line_per_beat():
    from tpu_export.cli import _progress

    log = _Terminal(tty=False)
    say = _progress(False, log)
    assert say.every is None  # heartbeat's own period (10 s)
    with heartbeat(say, "export", every=0.05):
        time.sleep(0.2)
    lines = log.text.splitlines()
    assert "\r" not in log.text and len(lines) >= 4
    assert all(line.split("] ", 1)[1].startswith("export") for line in lines)


def test_quiet_cli_progress_writes_nothing():
    from tpu_export.cli import _progress

    term = _Terminal(tty=True)
    with heartbeat(_progress(True, term), "export", every=0.02):
        time.sleep(0.1)
    assert term.text == ""


def test_weight_writing_reports_rate_and_time_left(tmp_path):
    """A streamed .tflite write says its tensors, MiB, rate and, until the end, an estimate of the time left."""
    import torch

    from tpu_export import litert_torch

    m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(80)]).eval()  # 320 MiB of weights
    lines = []
    litert_torch.convert(m, (torch.randn(1, 1024),), output_file_path=tmp_path / "m.tflite", progress=lines.append)
    writes = [line for line in lines if line.startswith("weights: ")]
    assert len(writes) >= 2, lines
    assert "s left)" in writes[0] and "MiB/s" in writes[0]
    assert re.match(r"weights: (\d+)/\1 tensors, 320/320 MiB written \([\d,]+ MiB/s\)$", writes[-1]), writes[-1]


@pytest.mark.slow
def test_convert_lm_tpu_stages_open_once_each(tmp_path):
    """The TPU target's own step lines (start, heartbeat, done) map onto one lower / compile / write stage each:
    a step's "done" line closes its stage instead of opening another."""
    from tests.llm_models import save_model_dir
    from tpu_export.targets.lm import convert_lm

    lines = []
    convert_lm(save_model_dir("llama", tmp_path / "m"), {"tpu-v6e": {"aot": False}}, tmp_path / "o",
               prefill_lengths=(8,), cache_len=64, progress=lines.append)
    tpu = [ln for ln in lines if ln.startswith("tpu-v6e: ")]
    assert "tpu-v6e: aot off: writing StableHLO only" in "\n".join(tpu)  # a note, said once with its target
    opened = [ln.split(": ")[1] for ln in tpu if ln.split(": ")[1] in ("lower", "compile", "write", "verify")
              and not re.search(r": (done in|failed after) [\d.]+ s$", ln)]
    done = [ln.split(": ")[1] for ln in tpu if re.search(r": done in [\d.]+ s$", ln)]
    assert opened == ["lower", "write", "verify"], tpu
    assert done == ["lower", "write", "verify"], tpu
