"""The TPU artifact loader against hostile files: a planted executable is never run by default
and never for a platform other than TPU; links, FIFOs, devices and compressed zip entries are
refused before anything is read (fast, bounded memory, no hang); every malformed manifest field
is a one-line ManifestError naming it; a corrupt StableHLO module fails at load."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import struct
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.tpu.artifact_helpers import assert_close_tree, mlp_inputs, mlp_program
from tpu_export import tpu_backend
from tpu_export.tpu_backend.artifact import format as fmt
from tpu_export.tpu_backend.artifact.errors import ArtifactCorruptError, ArtifactError, ManifestError

FP32_TOL = 1e-5
SIG = "signatures/serving_default.jaxexport"
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def bundle():
    return tpu_backend.export_program(mlp_program()[1])


@pytest.fixture
def art(bundle, tmp_path):
    return Path(bundle.save(tmp_path / "mlp.tpuexp"))


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _put(d: Path, rel: str, data: bytes, m: dict) -> None:
    """Write a file and record it in the manifest as the writer would (consistent hashes)."""
    (d / rel).parent.mkdir(parents=True, exist_ok=True)
    (d / rel).write_bytes(data)
    m["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _seal(d: Path, m: dict) -> None:
    m["manifest_sha256"] = fmt.manifest_digest(m)
    (d / "manifest.json").write_text(json.dumps(m))


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail instead of hanging (a FIFO opened for reading blocks until a writer comes)."""

    def boom(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _refused_fast(path, exc=ArtifactError, match=None, limit=1.0):
    t0 = time.perf_counter()
    with deadline(10), pytest.raises(exc, match=match) as ei:
        tpu_backend.load(path)
    assert time.perf_counter() - t0 < limit
    assert "\n" not in str(ei.value)
    return str(ei.value)


# ------------------------------------------------------------------ stored executables are code


def _plant_cpu_executable(d: Path, platform: str = "cpu") -> None:
    """Add a CPU executable of another function (every output a constant 42) under the artifact's
    signature, with correct hashes and digest: what a hostile author can ship."""
    import jax
    import jax.numpy as jnp

    from tpu_export.tpu_backend.artifact.versions import runtime_versions

    m = _manifest(d)
    sig = m["signatures"]["serving_default"]
    w = m["weights"]["tensors"]
    shapes = [w[n]["shape"] for n in sig["weight_names"]] + [[4 if isinstance(x, str) else x for x in t["shape"]]
                                                              for t in sig["inputs"]]
    dtypes = [w[n]["dtype"] for n in sig["weight_names"]] + [t["dtype"] for t in sig["inputs"]]
    outs = [([4 if isinstance(x, str) else x for x in t["shape"]], t["dtype"]) for t in sig["outputs"]]

    def evil(*args):
        return tuple(jnp.full(s, 42, dt) for s, dt in outs)

    args = [jax.ShapeDtypeStruct(tuple(s), np.dtype(dt)) for s, dt in zip(shapes, dtypes)]
    raw = bytes(jax.jit(evil, keep_unused=True).lower(*args).compile().runtime_executable().serialize())
    _put(d, "compiled/x/serving_default.bin", raw, m)
    _put(d, "compiled/x/report.json", b"{}", m)
    m["compiled"].append({
        "target": "cpu", "topology": "host", "platform": platform, "device_kind": jax.devices()[0].device_kind,
        "num_devices": 1, "versions": {k: v for k, v in runtime_versions().items() if k != "tpu_export"},
        "signatures": {"serving_default": {"file": "compiled/x/serving_default.bin", "input_shapes": shapes,
                                           "compile_seconds": 0.1}},
        "report": "compiled/x/report.json"})
    _seal(d, m)


def test_planted_executable_is_never_run(art, caplog):
    import jax

    from tpu_export.tpu_backend.artifact.compiled import CompiledSignature
    from tpu_export.tpu_backend.artifact.load import read_artifact
    from tpu_export.tpu_backend.runtime import TpuProgram

    model, _ = mlp_program()
    args, kwargs = mlp_inputs(4, seed=3)
    want = model(*args, **kwargs)
    _plant_cpu_executable(art)

    # The plant is real: a runtime that trusted it would return 42s.
    a = read_artifact(art)
    assert a.compiled[0].signatures["serving_default"].executable is None  # never even read
    raw = (art / "compiled/x/serving_default.bin").read_bytes()
    c = dataclasses.replace(a.compiled[0], signatures={"serving_default": CompiledSignature(
        raw, a.manifest["compiled"][0]["signatures"]["serving_default"]["input_shapes"], 0.1)})
    trusting = TpuProgram(signatures=a.signatures, weights=a.weights, manifest=a.manifest, compiled=[c],
                          source="test", use_compiled=True, stored_platforms=None)
    assert float(trusting(*args, **kwargs)["logits"].flatten()[0]) == 42.0

    for opt_in in (False, True):
        with caplog.at_level(logging.INFO, logger="tpu_export.tpu_backend.runtime"):
            caplog.clear()
            prog = tpu_backend.load(art, use_compiled=opt_in)
            assert_close_tree(prog(*args, **kwargs), want, FP32_TOL)
        assert not prog.uses_stored_executable()
        said = " ".join(r.getMessage() for r in caplog.records)
        assert ("only TPU executables are ever loaded" if opt_in else "loaded only on request") in said, said

    # Relabelled "tpu": still refused on this CPU host (platform and device kind are checked).
    shutil.rmtree(art / "compiled")
    m = _manifest(art)
    m["compiled"] = []
    for rel in [r for r in m["files"] if r.startswith("compiled/")]:
        del m["files"][rel]
    _seal(art, m)
    _plant_cpu_executable(art, platform="tpu")
    prog = tpu_backend.load(art, use_compiled=True)
    assert_close_tree(prog(*args, **kwargs), want, FP32_TOL)
    assert not prog.uses_stored_executable() and jax.devices()[0].platform == "cpu"


def test_cli_run_compiles_the_stablehlo_even_with_use_compiled(art, tmp_path, capsys):
    from tpu_export.cli import main

    model, _ = mlp_program()
    args, kwargs = mlp_inputs(4, seed=3)
    _plant_cpu_executable(art)
    np.save(tmp_path / "x.npy", args[0].numpy())
    np.save(tmp_path / "offset.npy", kwargs["offset"].numpy())
    for extra in ([], ["--use-compiled"]):
        rc = main(["run", str(art), "--input", f"x={tmp_path / 'x.npy'}",
                   "--input", f"offset={tmp_path / 'offset.npy'}", "--save-outputs", str(tmp_path / "out.npz"), *extra])
        assert rc == 0, capsys.readouterr().err
        got = np.load(tmp_path / "out.npz")["logits"]
        np.testing.assert_allclose(got, model(*args, **kwargs)["logits"].detach().numpy(), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ only regular files


def test_symlinked_weights_to_dev_zero(art):
    (art / "weights.safetensors").unlink()
    (art / "weights.safetensors").symlink_to("/dev/zero")
    msg = _refused_fast(art, ArtifactCorruptError, "weights.safetensors is a symlink")
    assert "only regular files" in msg


def test_fifo_instead_of_a_file_does_not_hang(art):
    for rel in (SIG, "manifest.json"):
        saved = (art / rel).read_bytes()
        (art / rel).unlink()
        os.mkfifo(art / rel)
        _refused_fast(art, ArtifactCorruptError, f"{rel} is a FIFO")
        (art / rel).unlink()
        (art / rel).write_bytes(saved)
    tpu_backend.read_artifact(art)  # restored: it reads again


def test_symlinked_directory_inside_is_refused_but_a_symlinked_root_is_fine(art, tmp_path):
    link = tmp_path / "current.tpuexp"
    link.symlink_to(art)
    tpu_backend.read_artifact(link)  # the user's own path may be a link
    (tmp_path / "elsewhere").mkdir()
    shutil.move(art / "signatures", tmp_path / "elsewhere" / "signatures")
    (art / "signatures").symlink_to(tmp_path / "elsewhere" / "signatures")
    _refused_fast(art, ArtifactCorruptError, "signatures is a symlink")


def test_fifo_given_as_the_artifact_path(tmp_path):
    os.mkfifo(tmp_path / "model.tpuexp.zip")
    _refused_fast(tmp_path / "model.tpuexp.zip", ArtifactCorruptError, "is a FIFO, not an artifact")


@pytest.mark.parametrize("swap", ["symlink", "fifo"])
@pytest.mark.parametrize("form", ["dir", "zip"])
def test_weights_are_mapped_from_the_descriptor_that_was_checked(bundle, tmp_path, monkeypatch, form, swap):
    """The file is swapped (for a symlink to a same-shaped decoy with zeroed tensors, or a FIFO) just after the
    container checked it: the load still maps the checked file, since nothing is reopened by name."""
    from tpu_export.tpu_backend.artifact import container

    saved = Path(bundle.save(tmp_path / ("m.tpuexp" + (".zip" if form == "zip" else ""))))
    victim = saved / "weights.safetensors" if form == "dir" else saved
    cls = container.DirContainer if form == "dir" else container.ZipContainer
    checked = cls.span

    def span_then_swap(self, rel):
        got = checked(self, rel)
        if rel == "weights.safetensors":
            _, offset, length = got
            raw = bytearray(victim.read_bytes())
            data = offset + 8 + int.from_bytes(raw[offset:offset + 8], "little")
            raw[data:offset + length] = bytes(offset + length - data)
            victim.rename(tmp_path / "checked")
            if swap == "fifo":
                os.mkfifo(victim)
            else:
                (tmp_path / "decoy").write_bytes(bytes(raw))
                victim.symlink_to(tmp_path / "decoy")
        return got

    monkeypatch.setattr(cls, "span", span_then_swap)
    with deadline(10):
        loaded = tpu_backend.read_artifact(saved)
    assert victim.is_symlink() or victim.is_fifo()  # the swap happened before the weights were read
    assert set(loaded.weights) == set(bundle.weights)
    assert any(np.any(w.numpy()) for w in bundle.weights.values())  # so the zeroed decoy differs
    for name, w in loaded.weights.items():
        np.testing.assert_array_equal(w, bundle.weights[name].numpy())


# ------------------------------------------------------------------ only stored zip entries


def _rezip(src: str, dst: Path, *, deflate=(), duplicate: str | None = None, encrypt: str | None = None) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zi = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED if info.filename in deflate else zipfile.ZIP_STORED
            zout.writestr(zi, data)
            if info.filename == duplicate:
                with pytest.warns(UserWarning, match="Duplicate name"):
                    zout.writestr(zi, data)
    if encrypt:
        raw = bytearray(dst.read_bytes())
        raw[_central_entry(raw, encrypt) + 8] |= 1  # the "encrypted" flag bit
        dst.write_bytes(bytes(raw))


def _bomb_zip(src: str, dst: Path, name: str) -> None:
    """``src`` with entry ``name`` replaced by a valid deflate stream of 2 GiB of zeros (~2 MB):
    16 MiB compressed once, with a full flush so that copies of it concatenate."""
    chunk = bytes(1 << 24)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    stream = block * 128 + c.flush()
    crc = 0
    for _ in range(128):
        crc = zlib.crc32(chunk, crc)
    local, central = bytearray(), bytearray()
    with zipfile.ZipFile(src) as zin:
        for info in zin.infolist():
            data = zin.read(info)
            method, crc_, size, body = (8, crc, 128 << 24, stream) if info.filename == name else \
                (0, zlib.crc32(data), len(data), data)
            fields = (0, method, 0, 33, crc_, len(body), size, len(info.filename))
            central += struct.pack("<4sHH4H3I5H2I", b"PK\x01\x02", 20, 20, *fields, 0, 0, 0, 0, 0, len(local))
            central += info.filename.encode()
            local += struct.pack("<4sH4H3I2H", b"PK\x03\x04", 20, *fields, 0) + info.filename.encode() + body
        n = len(zin.infolist())
    eocd = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, n, n, len(central), len(local), 0)
    dst.write_bytes(bytes(local + central + eocd))


@pytest.fixture(scope="module")
def zip_bomb(bundle, tmp_path_factory):
    d = tmp_path_factory.mktemp("bomb")
    dst = d / "bomb.tpuexp.zip"
    _bomb_zip(bundle.save(d / "ok.tpuexp.zip"), dst, "weights.safetensors")
    return dst


def _central_entry(raw: bytes, name: str) -> int:
    """Offset of ``name``'s record in a zip's central directory."""
    at = raw.rfind(b"PK\x05\x06")
    while True:
        at = raw.rfind(b"PK\x01\x02", 0, at)
        assert at >= 0, name
        if raw[at + 46:at + 46 + len(name)] == name.encode():
            return at


def test_deflated_entry_inflating_to_2_gib_fails_fast(zip_bomb):
    assert zip_bomb.stat().st_size < 4 << 20
    with zipfile.ZipFile(zip_bomb) as z:  # a well-formed bomb: zipfile would inflate all of it
        assert z.getinfo("weights.safetensors").file_size == 2 << 30
        with z.open("weights.safetensors") as f:
            assert f.read(1 << 20) == bytes(1 << 20)
    tracemalloc.start()
    try:
        _refused_fast(zip_bomb, ArtifactCorruptError, r"weights\.safetensors is compressed \(zip method 8\)")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, peak


def test_inspect_refuses_the_zip_bomb_in_one_line(zip_bomb, capsys):
    from tpu_export.cli import main

    t0 = time.perf_counter()
    assert main(["inspect", str(zip_bomb)]) == 1
    err = capsys.readouterr().err
    assert time.perf_counter() - t0 < 1.0
    assert err.count("\n") == 1 and err.startswith("tpu-export: error: ") and "is compressed" in err, err


@pytest.mark.parametrize("variant, match", [
    ({"deflate": ("manifest.json",)}, r"manifest\.json is compressed"),
    ({"duplicate": "weights.safetensors"}, "lists an entry twice"),
    ({"encrypt": SIG}, "is encrypted"),
])
def test_zip_variants_the_writer_never_makes(bundle, tmp_path, variant, match):
    src = bundle.save(tmp_path / "ok.tpuexp.zip")
    _rezip(src, tmp_path / "v.tpuexp.zip", **variant)
    _refused_fast(tmp_path / "v.tpuexp.zip", ArtifactCorruptError, match)


# ------------------------------------------------------------------ the manifest's schema


def _set(path):
    """An edit that sets manifest[path...] (keys and list indices) to a value."""
    def edit(m, value):
        *head, last = path
        for k in head:
            m = m[k]
        m[last] = value
    return edit


S = ("signatures", "serving_default")
BAD_FIELDS = [  # (where, value, what the message must name): each raised TypeError or similar before
    (("platforms",), [{"tpu": 1}], "platforms"),
    (("weights", "tensors", "fc1.weight", "dtype"), ["float32"], r"weights.tensors\['fc1.weight'\].dtype"),
    ((*S, "file"), ["signatures/serving_default.jaxexport"], r"signatures\['serving_default'\].file"),
    ((*S, "weight_names"), [["fc1.weight"]], "weight_names"),
    ((*S, "inputs", 0, "sharding"), {"data": 1}, r"inputs\[0\].sharding"),
    ((*S, "inputs", 0, "shape"), ["batch", True], r"inputs\[0\].shape"),
    ((*S, "dim_ranges"), {"batch": [True, 5]}, "dim_ranges"),
    ((*S, "dim_ranges"), {"batch": [1, 2**70]}, "dim_ranges"),
    ((*S, "output_structure", "keys"), [["logits"], "stats"], "output_structure"),
    (("mesh",), {"axis_names": [["data"]], "shape": [1]}, "mesh"),
    (("files", SIG, "size"), True, r"files\['signatures/serving_default.jaxexport'\]"),
    (("files", SIG, "size"), 2**80, r"files\['signatures/serving_default.jaxexport'\]"),
    (("enable_x64",), "yes", "enable_x64"),
    (("created_by",), ["jax"], "created_by"),
    (("partition_rules",), "rules", "partition_rules"),
    (("quant",), {"scheme": "weight_only_int8", "weights": {"w": {"int8": ["x"], "scale": "fc1.bias"}}},
     r"quant.weights\['w'\]"),
    (("compiled",), [{"target": "t", "topology": "x", "platform": "tpu", "device_kind": "k", "num_devices": 1,
                      "report": "weights.safetensors", "versions": ["jaxlib"], "signatures": {}}],
     r"compiled\[0\].versions"),
    (("compiled",), [{"target": "t", "topology": "x", "platform": "tpu", "device_kind": "k", "num_devices": 1,
                      "report": "weights.safetensors", "signatures": {"serving_default": {"file": {"a": 1}}}}],
     r"compiled\[0\].signatures\['serving_default'\].file"),
    (("compiled",), [{"target": "t", "topology": "x", "platform": "metal", "device_kind": "k", "num_devices": 1,
                      "report": "weights.safetensors", "signatures": {}}], r"compiled\[0\].platform"),
    # format 3's index_bound: an int > 0, on inputs only
    ((*S, "inputs", 1, "index_bound"), True, "index_bound"),
    ((*S, "inputs", 1, "index_bound"), 0, "index_bound"),
    ((*S, "inputs", 1, "index_bound"), "5", "index_bound"),
    ((*S, "outputs", 0, "index_bound"), 5, r"outputs\[0\].index_bound: only a signature's inputs"),
]


@pytest.mark.parametrize("where, value, names", BAD_FIELDS)
def test_every_malformed_field_is_a_one_line_manifest_error(art, where, value, names):
    from tpu_export.tpu_backend.artifact.load import read_artifact

    m = _manifest(art)
    _set(where)(m, value)
    _seal(art, m)
    with pytest.raises(ManifestError, match=names) as ei:
        read_artifact(art)
    assert str(ei.value).startswith(f"{art}: manifest.json: ") and "\n" not in str(ei.value)


def test_index_bound_is_read_in_format_3_and_refused_before(art):
    from tpu_export.tpu_backend.artifact.load import read_artifact

    golden = tpu_backend.read_artifact(GOLDEN / "tiny_mlp_v3.tpuexp.zip")
    assert golden.signatures["serving_default"].inputs[1].index_bound == 4
    m = _manifest(art)
    m["signatures"]["serving_default"]["inputs"][1]["index_bound"] = 5
    _seal(art, m)
    assert read_artifact(art).signatures["serving_default"].inputs[1].index_bound == 5
    m["format_version"] = 2
    _seal(art, m)
    with pytest.raises(ManifestError, match=r"inputs\[1\].index_bound does not exist in format version 2"):
        read_artifact(art)


@pytest.mark.parametrize("depth", [100_000, 70])
def test_deeply_nested_manifest(art, depth):
    m = _manifest(art)
    m["created_by"]["jax"] = "@@DEEP@@"
    text = json.dumps(m).replace('"@@DEEP@@"', "[" * depth + "]" * depth)
    (art / "manifest.json").write_text(text)
    _refused_fast(art, ManifestError, f"manifest.json is nested more than {fmt.MAX_JSON_DEPTH} levels deep")


def test_huge_manifest_is_not_parsed(art):
    (art / "manifest.json").write_bytes(b" " * (17 << 20))
    _refused_fast(art, ManifestError, "refusing to parse it")


# ------------------------------------------------------------------ corrupt StableHLO fails at load


@pytest.mark.parametrize("module", [b"not StableHLO bytecode", b""])
def test_corrupt_stablehlo_fails_at_load(art, module):
    from jax import export

    exp = export.deserialize(bytearray((art / SIG).read_bytes()))
    bad = dataclasses.replace(exp, mlir_module_serialized=module).serialize()
    m = _manifest(art)
    _put(art, SIG, bytes(bad), m)
    _seal(art, m)  # consistent hashes: only parsing the module can tell
    for verify in (True, False):
        with pytest.raises(ArtifactCorruptError, match=f"{SIG}: .*(not a readable jax export|no public main)"):
            tpu_backend.load(art, verify=verify)


def test_zip_entry_is_read_no_further_than_the_manifest_says(bundle, tmp_path):
    """The manifest's size bounds every read: an entry whose zip sizes were enlarged to cover
    the bytes after it is refused before it is read."""
    z = Path(bundle.save(tmp_path / "m.tpuexp.zip"))
    raw = bytearray(z.read_bytes())
    with zipfile.ZipFile(z) as zf:
        info = zf.getinfo(SIG)
    cd = _central_entry(raw, SIG)
    grown = info.file_size + 100
    raw[cd + 20:cd + 28] = grown.to_bytes(4, "little") * 2  # compressed and uncompressed sizes
    z.write_bytes(bytes(raw))
    _refused_fast(z, ArtifactCorruptError, rf"{SIG} is {grown} bytes, the manifest records {info.file_size}")
