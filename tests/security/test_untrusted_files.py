"""converter/untrusted.py, the one rule for a user's file, on its own: regular files only, nothing followed out of
the folder, a FIFO refused without waiting, the size checked before a byte is read; and the atomic writer's
disk-full error (converter/atomic.py), which names the file and leaves nothing behind."""

from __future__ import annotations

import errno
import os
import time

import pytest

from tests.security.probe import probe
from tpu_export.converter import atomic
from tpu_export.converter.untrusted import LIMITS, Folder, UntrustedFileError, limit, read_bytes, read_json


def _err(fn, reason: str, *needles) -> UntrustedFileError:
    with pytest.raises(UntrustedFileError) as e:
        fn()
    assert e.value.reason == reason, e.value
    msg = str(e.value)
    assert "\n" not in msg and "Fix:" in msg and all(n in msg for n in needles), msg
    return e.value


def test_a_regular_file_inside_the_folder_is_read(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.json").write_text('{"x": 1}')
    (tmp_path / "link.json").symlink_to("sub/a.json")  # a link that stays inside is followed
    with Folder(tmp_path) as d:
        assert d.read_json("sub/a.json") == {"x": 1} == d.read_json("link.json")
    assert read_json("a.json", root=tmp_path / "sub") == {"x": 1}
    assert read_bytes(tmp_path / "link.json", max_bytes=100) == b'{"x": 1}'  # the user's own name may be a link


@pytest.mark.parametrize("name", ["../x.json", "/etc/passwd", "a/../../x.json", "", "a//b"])
def test_a_name_leaving_the_folder_is_refused(tmp_path, name):
    (tmp_path / "x.json").write_text("{}")
    (tmp_path / "d").mkdir()
    with Folder(tmp_path / "d") as d:
        _err(lambda: d.read_json(name), "escapes", "not a plain path inside the folder")


def test_a_symlink_leaving_the_folder_is_refused(tmp_path):
    (tmp_path / "secret.json").write_text('{"k": 1}')
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.json").symlink_to(tmp_path / "secret.json")
    (tmp_path / "d" / "sub").symlink_to(tmp_path)  # a directory link out, then a plain name under it
    with Folder(tmp_path / "d") as d:
        _err(lambda: d.read_json("a.json"), "escapes", "a.json", "outside the folder")
        _err(lambda: d.read_json("sub/secret.json"), "escapes", "outside the folder")
        _err(lambda: d.open("a.json", follow_inside=False), "symlink", "is a symlink")


@pytest.mark.subprocess
def test_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "f.json")
    r = probe(f"Folder({str(tmp_path)!r}).read_json('f.json')",
              setup="from tpu_export.converter.untrusted import Folder", timeout=30)
    assert r["error"] == "UntrustedFileError" and "f.json: is a FIFO, not a regular file" in r["message"], r
    r = probe(f"read_bytes({str(tmp_path / 'f.json')!r}, max_bytes=10)",
              setup="from tpu_export.converter.untrusted import read_bytes", timeout=30)
    assert r["error"] == "UntrustedFileError" and "is a FIFO" in r["message"] and r["seconds"] < 2, r


@pytest.mark.subprocess
def test_a_device_named_directly_is_refused_without_reading():
    r = probe("read_bytes('/dev/zero', max_bytes=1 << 40)",
              setup="from tpu_export.converter.untrusted import read_bytes", timeout=30, mem_limit_gb=2)
    assert r["error"] == "UntrustedFileError" and "is a character device" in r["message"], r
    assert r["seconds"] < 2 and r["hwm_mb"] < 200, r


def test_the_size_is_checked_before_reading(tmp_path, monkeypatch):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(LIMITS["json"] + 1)  # sparse: no disk, and reading it would cost 64 MB
    t0 = time.perf_counter()
    e = _err(lambda: read_json(big), "too_large", "big.json", f"{LIMITS['json'] + 1} bytes",
             "TPU_EXPORT_MAX_JSON_BYTES")
    assert time.perf_counter() - t0 < 0.5, e
    monkeypatch.setenv("TPU_EXPORT_MAX_JSON_BYTES", "8")
    assert limit("json") == 8
    (tmp_path / "small.json").write_text('{"a": [1, 2, 3]}')
    _err(lambda: read_json(tmp_path / "small.json"), "too_large", "more than the 8")
    monkeypatch.setenv("TPU_EXPORT_MAX_JSON_BYTES", "lots")
    with pytest.raises(ValueError, match="TPU_EXPORT_MAX_JSON_BYTES='lots' is not a positive number of bytes"):
        limit("json")


def test_malformed_json_and_text_are_one_line(tmp_path):
    (tmp_path / "a.json").write_text('{"a": ')
    _err(lambda: read_json(tmp_path / "a.json"), "malformed", "a.json", "not valid JSON")
    (tmp_path / "b.json").write_bytes(b'{"a": "\xff"}')
    _err(lambda: read_json(tmp_path / "b.json"), "malformed", "b.json", "not UTF-8")
    (tmp_path / "c.json").write_text("[" * 100_000 + "]" * 100_000)
    _err(lambda: read_json(tmp_path / "c.json"), "malformed", "c.json")


def test_missing_is_named(tmp_path):
    with Folder(tmp_path) as d:
        _err(lambda: d.read_json("nope.json"), "missing", "nope.json", "no such file")
        assert d.lstat("nope.json") is None and not d.exists("a/b.json")
    _err(lambda: Folder(tmp_path / "nowhere"), "missing", "nowhere")


def _full_on_fsync(monkeypatch, err: int):
    """os.fsync fails as it does on a filesystem that allocates late (NFS, ext4 delalloc, quotas): the data was
    accepted by write() and the space turns out missing when it is flushed."""
    def fsync(fd):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_names_the_file_and_leaves_nothing(tmp_path, monkeypatch, err):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    _full_on_fsync(monkeypatch, err)
    with pytest.raises(atomic.DiskFullError) as e:
        atomic.write_file(target, b"x" * (1 << 20))
    msg = str(e.value)
    assert msg.startswith(f"{target}: ") and "\n" not in msg and "nothing was written there" in msg, msg
    assert ("quota" in msg) == (err == errno.EDQUOT) and e.value.errno == err and isinstance(e.value, OSError)
    assert target.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["out.bin"]  # no temp file left


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/bin/mount"), reason="needs root to mount a tmpfs")
def test_a_real_full_tmpfs_names_the_file(tmp_path):
    import subprocess

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(atomic.DiskFullError, match=rf"^{mnt}/model.tflite: no space left on the device"):
            atomic.write_file(mnt / "model.tflite", b"\0" * (1 << 20))
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_positioned_reads_past_the_per_call_cap_are_whole(tmp_path, monkeypatch):
    """A tensor larger than one read call moves (Linux: 0x7ffff000 bytes, so any 2.8 GB embedding) is read in
    several calls, not refused as a file that shrank: the cap made small here, the file real."""
    from tpu_export.converter import untrusted

    data = bytes(range(256)) * 40
    p = tmp_path / "w.bin"
    p.write_bytes(data)
    monkeypatch.setattr(untrusted, "_MAX_IO", 1000)
    fd = os.open(p, os.O_RDONLY)
    try:
        buf = bytearray(9000)
        assert untrusted.pread_into(fd, buf, 700) == 9000 and bytes(buf) == data[700:9700]
        assert untrusted.pread_exact(fd, 100, 5000) == data[100:5100]
        tail = bytearray(2000)
        assert untrusted.pread_into(fd, tail, len(data) - 500) == 500  # short only at the end of the file
    finally:
        os.close(fd)
