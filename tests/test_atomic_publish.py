"""Writes land whole with the umask's mode; a multi-target convert is all or nothing; a kill at any
point of a publish leaves the old or the new artifact, and the next save cleans up after it."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import tpu_export
from tpu_export import litert_torch
from tpu_export.converter import atomic
from tpu_export.converter.errors import ConversionError
from tpu_export.targets import CompatibilityError, QuantizationError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))  # the flatten is a RESHAPE Core ML runs on CPU


ARGS = (torch.randn(1, 3, 8, 8),)


def snapshot(root) -> dict:
    """Every path under ``root`` with its mode and (for files) content hash."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            digest = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else None
            out[os.path.relpath(p, root)] = (st.st_mode, digest)
    return out


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_every_written_file_and_folder_honors_the_umask(tmp_path, umask_027):
    written = tpu_export.convert(Cnn().eval(), ARGS, targets=["cpu-xla", "android", "web"], out_dir=tmp_path / "out")
    m = litert_torch.convert(Cnn().eval(), ARGS)
    m.export(tmp_path / "m.tflite")
    files = [tmp_path / "m.tflite", tmp_path / "out" / "summary.json", *(tmp_path / "out" / "web").iterdir()]
    files += [p for p in (tmp_path / "out" / "cpu-xla").rglob("*")]
    dirs = [p for p in files if p.is_dir()] + [tmp_path / "out" / t for t in written]
    assert len(files) > 8
    for p in files:
        want = 0o750 if p.is_dir() else 0o640
        assert (p.stat().st_mode & 0o777) == want, (p, oct(p.stat().st_mode))
    for d in dirs:
        assert (d.stat().st_mode & 0o777) == 0o750, d


def test_a_failing_target_leaves_the_out_dir_byte_for_byte(tmp_path):
    out = tmp_path / "out"
    tpu_export.convert(Cnn().eval(), ARGS, targets=["android"], out_dir=out)
    before = snapshot(out)
    # the second target fails in its strict delegate check, after the first was built
    with pytest.raises(CompatibilityError, match="RESHAPE"):
        tpu_export.convert(Cnn().eval(), ARGS, targets=["cpu-xla", "ios"], out_dir=out, strict_ops=True)
    assert snapshot(out) == before
    # iot without calibration data fails before capture
    with pytest.raises(QuantizationError, match="calibration_data"):
        tpu_export.convert(Cnn().eval(), ARGS, targets=["cpu-xla", "iot"], out_dir=out)
    assert snapshot(out) == before


def test_a_folder_the_tool_did_not_write_is_never_replaced(tmp_path):
    out = tmp_path / "out"
    (out / "android").mkdir(parents=True)
    (out / "android" / "notes.txt").write_text("mine")
    with pytest.raises(ConversionError, match="refusing to replace .*android"):
        tpu_export.convert(Cnn().eval(), ARGS, targets=["android"], out_dir=out)
    assert (out / "android" / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(out)) == ["android"]


def test_a_second_convert_replaces_each_target_whole(tmp_path):
    out = tmp_path / "out"
    tpu_export.convert(Cnn().eval(), ARGS, targets=["web"], out_dir=out)
    tpu_export.convert(Cnn().eval(), ARGS, targets=["android"], out_dir=out)
    (out / "android" / "stale.tflite").write_bytes(b"from an older run")
    tpu_export.convert(Cnn().eval(), ARGS, targets=["web", "android"], out_dir=out)  # web is still the tool's
    assert sorted(os.listdir(out)) == ["android", "summary.json", "web"]
    assert os.listdir(out / "android") == ["android.tflite"]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["targets"]) == ["android", "web"]


_KILL_CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from tpu_export.converter import atomic
    target, version, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "between-renames":
        atomic._exchange = lambda a, b: False          # the two-rename fallback of filesystems without exchange
        real = os.rename
        calls = []
        def rename(a, b):
            calls.append(a)
            if len(calls) == 2:                         # old moved aside, new not yet in place
                os.kill(os.getpid(), signal.SIGKILL)
            real(a, b)
        os.rename = rename
    stage = atomic.staging_dir(target)
    for i in range(50):
        with open(os.path.join(stage, f"part{{i}}.bin"), "wb") as f:
            f.write(version.encode() * 20000)
    if mode == "while-writing":
        os.kill(os.getpid(), signal.SIGKILL)
    atomic.publish_dir(stage, target)
""")


def _publish_in_child(target, version, mode):
    code = _KILL_CHILD.format(root=ROOT)
    return subprocess.run([sys.executable, "-c", code, str(target), version, mode], capture_output=True, timeout=60)


def _version(target) -> set:
    return {open(os.path.join(target, n), "rb").read(1) for n in os.listdir(target)}


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["between-renames", "while-writing"])
def test_a_kill_during_a_publish_leaves_the_old_folder_and_the_next_save_cleans_up(tmp_path, mode):
    target = tmp_path / "model.tpuexp"
    assert _publish_in_child(target, "A", "none").returncode == 0
    r = _publish_in_child(target, "B", mode)
    assert r.returncode == -signal.SIGKILL
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".model.tpuexp.")]
    assert leftovers  # the kill left an aside copy or a staging folder
    atomic.recover(target)  # what every save runs first
    assert _version(target) == {b"A"} and len(os.listdir(target)) == 50
    assert os.listdir(tmp_path) == ["model.tpuexp"]
    assert _publish_in_child(target, "C", "none").returncode == 0
    assert _version(target) == {b"C"} and os.listdir(tmp_path) == ["model.tpuexp"]


@pytest.mark.subprocess
@pytest.mark.slow
def test_kills_at_random_instants_always_leave_a_whole_folder(tmp_path):
    target = tmp_path / "model.tpuexp"
    assert _publish_in_child(target, "A", "none").returncode == 0
    code = _KILL_CHILD.format(root=ROOT)
    seen = set()
    for i in range(12):
        p = subprocess.Popen([sys.executable, "-c", code, str(target), "BC"[i % 2], "none"])
        time.sleep(0.02 + 0.01 * i)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        atomic.recover(target)
        v = _version(target)
        assert len(v) == 1 and len(os.listdir(target)) == 50, v  # one whole version, never a mix
        seen |= v
    assert os.listdir(tmp_path) == ["model.tpuexp"]


@pytest.mark.subprocess
def test_concurrent_writers_of_one_file_never_collide(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from tpu_export.converter.atomic import write_file
        for i in range(200):
            write_file(sys.argv[1], sys.argv[2].encode() * 1000)
    """)
    path = tmp_path / "summary.json"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), c], stderr=subprocess.PIPE) for c in "xy"]
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert path.read_bytes() in (b"x" * 1000, b"y" * 1000)
    assert os.listdir(tmp_path) == ["summary.json"]
