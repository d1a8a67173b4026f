"""``read_artifact(isolate=True)`` / ``tpu_backend.load(isolate=True)`` against re-signed StableHLO
that crashes or hangs jaxlib's MLIR bytecode reader: an ArtifactCorruptError naming the artifact
and the export, within the timeout, and this process lives on. Without isolate the same
artifact kills the process (checked in a child, so the reproducers cannot silently go stale).

The hostile modules are a tiny jax export (plain jnp, locations off: its bytes depend only on
the pinned jax, not on this repo's code or paths) with recorded bit flips, re-signed into a real
artifact of the MLP. The flips were found by searching seeds of 1-3 random bit flips of its
726-byte StableHLO bytecode (400 seeds: 4 SIGSEGV, 1 SIGABRT, 3 hangs); the ones kept crashed in
3 of 3 fresh processes and hung for 60 s of 60. If jax is upgraded, TINY_SHA256 fails first:
search new flips the same way (a child parses candidates in a loop; note which one it dies or
stalls on).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.tpu.artifact_helpers import assert_close_tree, mlp_inputs, mlp_program
from tpu_export import tpu_backend
from tpu_export.tpu_backend.artifact import format as fmt
from tpu_export.tpu_backend.artifact import read_artifact
from tpu_export.tpu_backend.artifact.errors import ArtifactCorruptError, ArtifactError

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SIG = "signatures/serving_default.jaxexport"
TINY_SHA256 = "9ddb5f3f25694e13232d18b5ee596611ca78f22323738c6986b4b5f4f57012f6"  # jax 0.10.2
# (byte offset into the StableHLO bytecode, bit) -> what jaxlib 0.10.2's parser does with it
SEGV = [(227, 4)]
ABRT = [(46, 0)]  # glibc "malloc(): invalid size (unsorted)": the parser corrupted its own heap
HANG = [(146, 1), (678, 4)]  # loops in mlir_module(), flat memory


def _tiny_export() -> tuple[bytes, int]:
    """A jax export of tanh(x @ w).sum(-1), and where its StableHLO bytecode starts in it."""
    import jax
    import jax.numpy as jnp
    from jax import export
    from jax._src import config  # no public context manager for this in jax 0.10.2

    def f(x, w):
        return jnp.tanh(x @ w).sum(-1)

    with config.traceback_in_locations_limit(0):  # no file:line locations in the bytes
        e = export.export(jax.jit(f), platforms=("cpu",))(jax.ShapeDtypeStruct((4, 8), jnp.float32),
                                                           jax.ShapeDtypeStruct((8, 3), jnp.float32))
    data = e.serialize()
    return bytes(data), bytes(data).find(e.mlir_module_serialized)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    bundle = tpu_backend.export_program(mlp_program()[1])
    return Path(bundle.save(tmp_path_factory.mktemp("iso") / "mlp.tpuexp"))


def _hostile(clean: Path, dst: Path, flips) -> Path:
    """The clean artifact with its export replaced by the flipped tiny one, hashes and manifest
    digest recomputed: what an author who signs hostile bytes ships."""
    data, at = _tiny_export()
    assert hashlib.sha256(data).hexdigest() == TINY_SHA256, (
        "jax now serializes the tiny export differently: the recorded flips no longer apply; search new ones "
        "(see this file's docstring)")
    data = bytearray(data)
    for off, bit in flips:
        data[at + off] ^= 1 << bit
    shutil.copytree(clean, dst)
    (dst / SIG).write_bytes(bytes(data))
    m = json.loads((dst / "manifest.json").read_text())
    m["files"][SIG] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    m["manifest_sha256"] = fmt.manifest_digest(m)
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def _zipped(d: Path, dst: Path) -> Path:
    with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as z:
        for p in sorted(d.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(d).as_posix())
    return dst


@pytest.mark.parametrize("flips, sig", [(SEGV, signal.SIGSEGV), (ABRT, signal.SIGABRT)], ids=["segv", "abrt"])
def test_parser_crash_is_a_one_line_error_with_isolate(clean, tmp_path, flips, sig):
    art = _hostile(clean, tmp_path / "evil.tpuexp", flips)
    # without isolate the loader's own parse kills the process: the reproducer is real
    code = "import sys; from tpu_backend.artifact import read_artifact; read_artifact(sys.argv[1])"
    bare = subprocess.run([sys.executable, "-c", code, str(art)], cwd=ROOT, capture_output=True, timeout=300,
                          check=False, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert bare.returncode == -sig, (bare.returncode, bare.stderr[-500:])

    with pytest.raises(ArtifactCorruptError) as e:
        read_artifact(art, isolate=True)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{art}: {SIG}: ") and f"killed by {sig.name}" in msg, msg
    assert read_artifact(clean).signatures  # this process parses fine afterwards


def test_parser_hang_is_killed_after_the_timeout(clean, tmp_path):
    art = _zipped(_hostile(clean, tmp_path / "evil.tpuexp", HANG), tmp_path / "evil.tpuexp.zip")
    t = time.monotonic()
    with pytest.raises(ArtifactCorruptError) as e:
        tpu_backend.load(art, isolate=True, isolate_timeout=3)
    took = time.monotonic() - t
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{art}: {SIG}: ") and "did not finish within 3 s" in msg, msg
    assert took >= 3, took  # it really ran the full 3 s: a module that parses takes ~1 ms
    assert took < 60, took  # the child's jax import (~2 s here) + 3 s, with room for a loaded machine


def test_unreadable_export_is_the_usual_error_with_isolate(clean, tmp_path):
    art = _hostile(clean, tmp_path / "evil.tpuexp", [])
    (art / SIG).write_bytes(b"\0" * 64)  # not a flatbuffer: a Python error, in the child and in-process alike
    m = json.loads((art / "manifest.json").read_text())
    m["files"][SIG] = {"sha256": hashlib.sha256(b"\0" * 64).hexdigest(), "size": 64}
    m["manifest_sha256"] = fmt.manifest_digest(m)
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactCorruptError, match=r"serving_default\.jaxexport: not a readable jax export"):
        read_artifact(art, isolate=True)


def test_clean_artifact_loads_isolated_and_matches_torch(clean):
    model = mlp_program()[0]
    args, kwargs = mlp_inputs(4, seed=3)
    prog = tpu_backend.load(clean, isolate=True)
    assert_close_tree(prog(*args, **kwargs), model(*args, **kwargs))


def test_a_child_that_cannot_start_is_not_blamed_on_the_artifact(clean, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")  # e.g. an embedded interpreter without python
    with pytest.raises(ArtifactError) as e:
        read_artifact(clean, isolate=True)
    assert type(e.value) is ArtifactError and "failed to start (exit status 1" in str(e.value), e.value


def test_cli_isolate_turns_a_parser_crash_into_one_line(clean, tmp_path, capsys):
    from tpu_export.cli import main

    art = _hostile(clean, tmp_path / "evil.tpuexp", SEGV)
    for argv in (["inspect", str(art), "--isolate"], ["run", str(art), "--isolate", "--isolate-timeout", "20"]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tpu-export: error: ") and "killed by SIGSEGV" in err[0], err
    assert main(["inspect", str(clean), "--isolate"]) == 0
    assert "serving_default" in capsys.readouterr().out
