"""The artifact on disk: layout, atomic writes, and the loader's refusals (corrupted or
truncated files, wrong format version, tampered manifest), plus the checked-in golden artifact."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tpu.artifact_helpers import assert_close_tree, mlp_program
from tpu_export import converter, tpu_backend
from tpu_export.tpu_backend.artifact import format as fmt
from tpu_export.tpu_backend.artifact.container import open_container
from tpu_export.tpu_backend.artifact.errors import ArtifactCorruptError, ArtifactVersionError, ManifestError

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def bundle():
    """The MLP with one compiled target (a CPU compile: every kind of file, no libtpu needed)."""
    import jax

    _, prog = mlp_program()
    b = tpu_backend.export_program(prog)
    tpu_backend.compile_on_devices(b, jax.devices(), target="cpu", topology="host", dim_values={"batch": 4})
    return b


@pytest.fixture
def art_dir(bundle, tmp_path):
    return Path(bundle.save(tmp_path / "mlp.tpuexp"))


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path: Path, m: dict, *, redigest: bool) -> None:
    if redigest:
        m["manifest_sha256"] = fmt.manifest_digest(m)
    (path / "manifest.json").write_text(json.dumps(m))


ALL_FILES = ["manifest.json", "weights.safetensors", "signatures/serving_default.jaxexport",
             "compiled/cpu-host/serving_default.bin", "compiled/cpu-host/report.json"]


def test_layout_dir_and_zip_hold_the_same_files(bundle, tmp_path):
    d = Path(bundle.save(tmp_path / "m.tpuexp"))
    z = bundle.save(tmp_path / "m.tpuexp.zip")
    files = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    assert files == sorted(ALL_FILES)
    with zipfile.ZipFile(z) as zf:
        assert zf.namelist()[0] == "manifest.json"  # found first when streaming
        assert sorted(zf.namelist()) == files
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
        for f in files:
            assert zf.read(f) == (d / f).read_bytes()
    m = _manifest(d)
    assert m["format_version"] == tpu_backend.FORMAT_VERSION
    assert m["created_by"]["jax"] and m["created_by"]["libtpu"]
    assert m["program_fingerprint"] == mlp_program()[1].fingerprint()
    assert set(m["files"]) == set(ALL_FILES) - {"manifest.json"}
    sig = m["signatures"]["serving_default"]
    assert [i["name"] for i in sig["inputs"]] == ["x", "offset"]
    assert sig["inputs"][0] == {"name": "x", "shape": ["batch", 16], "dtype": "float32"}
    assert sig["output_structure"]["kind"] == "dict"
    assert m["compiled"][0]["report"] == "compiled/cpu-host/report.json"


def test_weights_file_is_standard_safetensors(bundle, art_dir, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from tpu_export.tpu_backend.artifact.safetensors_io import read_safetensors

    with safe_open(str(art_dir / "weights.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(bundle.weights)
        for k in f.keys():
            torch.testing.assert_close(f.get_tensor(k), bundle.weights[k], rtol=0, atol=0)
    # and the reader takes files written by the safetensors library, bf16 included
    ref = {"a": torch.randn(3, 4).to(torch.bfloat16), "b": torch.arange(5, dtype=torch.int32)}
    p = tmp_path / "lib.safetensors"
    save_file(ref, str(p))
    got = read_safetensors(str(p), 0, p.stat().st_size)
    assert torch.equal(torch.from_numpy(got["a"].view(np.int16).copy()).view(torch.bfloat16), ref["a"])
    assert np.array_equal(got["b"], ref["b"].numpy())


def test_save_is_atomic(bundle, tmp_path, monkeypatch):
    from tpu_export.tpu_backend.artifact import store

    target = tmp_path / "m.tpuexp"
    bundle.save(target)
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}

    def broken(f, tensors, metadata=None):
        f.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(store, "write_safetensors", broken)
    for path in (target, tmp_path / "new.tpuexp", tmp_path / "new.tpuexp.zip"):
        with pytest.raises(OSError, match="disk full"):
            bundle.save(path)
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before  # old one intact
    assert sorted(os.listdir(tmp_path)) == ["m.tpuexp"]  # no partial artifact, no staging left


def test_overwrite_replaces_the_artifact(bundle, tmp_path):
    target = tmp_path / "m.tpuexp"
    bundle.save(target)
    (target / "signatures" / "stale.jaxexport").write_bytes(b"x")
    bundle.save(target)
    tpu_backend.load(target)  # the stale file is gone, or the loader would refuse it
    assert sorted(os.listdir(tmp_path)) == ["m.tpuexp"]


def test_save_never_replaces_something_else(bundle, tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("keep me")
    (tmp_path / "report.zip").write_bytes(b"not an artifact")
    for path in (tmp_path / "home", tmp_path / "report.zip", tmp_path / "report.zip" / "x.tpuexp"):
        with pytest.raises((tpu_backend.ArtifactError, OSError)):
            bundle.save(path)
    assert (tmp_path / "home" / "notes.txt").read_text() == "keep me"
    assert (tmp_path / "report.zip").read_bytes() == b"not an artifact"
    bundle.save(tmp_path / "m.tpuexp.zip")
    bundle.save(tmp_path / "m.tpuexp.zip")  # an artifact is replaced


@pytest.mark.parametrize("rel", ALL_FILES)
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_file_in_directory_is_named(art_dir, rel, damage):
    p = art_dir / rel
    data = bytearray(p.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x5A
    else:
        data = data[: len(data) // 2]
    p.write_bytes(bytes(data))
    with pytest.raises((ArtifactCorruptError, ManifestError)) as ei:
        tpu_backend.load(art_dir)
    msg = str(ei.value)
    assert "manifest.json" in msg if rel == "manifest.json" else rel in msg, msg
    if rel != "manifest.json":
        assert ("truncated" in msg) if damage == "truncate" else ("sha256" in msg), msg


@pytest.mark.parametrize("rel", ALL_FILES)
def test_damaged_entry_in_zip_is_named(bundle, tmp_path, rel):
    z = bundle.save(tmp_path / "m.tpuexp.zip")
    box = open_container(z)
    _, offset, length = box.span(rel)
    box.close()
    with open(z, "r+b") as f:
        f.seek(offset + length // 2)
        b = f.read(1)
        f.seek(offset + length // 2)
        f.write(bytes([b[0] ^ 0x5A]))
    with pytest.raises((ArtifactCorruptError, ManifestError), match=rel.replace(".", r"\.")):
        tpu_backend.load(z)


def test_truncated_zip(bundle, tmp_path):
    z = Path(bundle.save(tmp_path / "m.tpuexp.zip"))
    data = z.read_bytes()
    for keep in (len(data) - 10, len(data) // 2, 100):
        z.write_bytes(data[:keep])
        with pytest.raises(ArtifactCorruptError, match="truncated"):
            tpu_backend.load(z)


def test_missing_and_extra_files(art_dir):
    (art_dir / "extra.bin").write_bytes(b"?")
    with pytest.raises(ArtifactCorruptError, match=r"not recorded in the manifest: \['extra.bin'\]"):
        tpu_backend.load(art_dir)
    (art_dir / "extra.bin").unlink()
    (art_dir / "compiled/cpu-host/report.json").unlink()
    with pytest.raises(ArtifactCorruptError, match="compiled/cpu-host/report.json is missing"):
        tpu_backend.load(art_dir)
    shutil.rmtree(art_dir)
    art_dir.mkdir()
    with pytest.raises(ArtifactCorruptError, match="manifest.json is missing"):
        tpu_backend.load(art_dir)


@pytest.mark.parametrize("version, hint", [(99, "Upgrade tpu-export"), (0, "Re-export"), ("1", "Re-export")])
def test_wrong_format_version(art_dir, version, hint):
    m = _manifest(art_dir)
    m["format_version"] = version
    _write_manifest(art_dir, m, redigest=True)
    with pytest.raises(ArtifactVersionError) as ei:
        tpu_backend.load(art_dir)
    msg = str(ei.value)
    assert f"version {version!r} is not supported" in msg
    assert f"reads versions {fmt.MIN_READABLE_VERSION} to {fmt.FORMAT_VERSION}" in msg and hint in msg


def test_edited_manifest_fails_its_digest(art_dir):
    m = _manifest(art_dir)
    m["signatures"]["serving_default"]["inputs"][0]["shape"] = ["batch", 17]
    _write_manifest(art_dir, m, redigest=False)
    with pytest.raises(ManifestError, match="edited after it was written"):
        tpu_backend.load(art_dir)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["signatures"]["serving_default"]["inputs"][0].update(shape=["batch", 17]),
     r"argument 4 is recorded as float32\['batch', 17\] but its export takes float32\[batch,16\]"),
    (lambda m: m["signatures"]["serving_default"]["inputs"][1].update(dtype="float32"),
     "argument 5 is recorded as float32"),
    (lambda m: m["files"].update({"../../etc/passwd": {"sha256": "0" * 64, "size": 1}}),
     "'../../etc/passwd' is not a safe relative path"),
    (lambda m: m.update(code="import os"), r"unexpected fields \['code'\]"),
    (lambda m: m["weights"]["tensors"]["fc1.weight"].update(dtype="object"), "is not a known dtype"),
    (lambda m: m["signatures"]["serving_default"].update(file="signatures/other.jaxexport"),
     "is not listed in files"),
    (lambda m: m["signatures"]["serving_default"]["output_structure"].update(kind="lambda"),
     "output_structure: expected a node with kind"),
    (lambda m: m.update(platforms=["cpu"]), r"platforms \['cpu'\] disagree with the export"),
    (lambda m: m.update(quant={"scheme": "weight_only_int8", "weights": {"fc1.weight": {"int8": "fc1.weight",
                                                                                      "scale": "fc1.bias"}}}),
     r"quant.weights\['fc1.weight'\] must name an int8 tensor"),
    (lambda m: m.update(quant={"scheme": "int3", "weights": {}}), "quant must name a scheme"),
    (lambda m: m.update(format_version=1), r"fields \['quant'\] do not exist in format version 1"),
    (lambda m: m.pop("quant"), r"missing fields \['quant'\]"),
])
def test_tampered_manifest_with_recomputed_digest(art_dir, edit, message):
    m = _manifest(art_dir)
    edit(m)
    _write_manifest(art_dir, m, redigest=True)
    with pytest.raises(ManifestError, match=message):
        tpu_backend.load(art_dir)


def test_manifest_not_json(art_dir):
    (art_dir / "manifest.json").write_text('{"format": ')
    with pytest.raises(ManifestError, match="manifest.json is not valid JSON"):
        tpu_backend.load(art_dir)


def test_not_an_artifact(tmp_path):
    (tmp_path / "x.zip").write_bytes(b"not a zip")
    with pytest.raises(ArtifactCorruptError, match="neither an artifact directory nor a readable zip"):
        tpu_backend.load(tmp_path / "x.zip")
    with pytest.raises(tpu_backend.ArtifactError, match="no such artifact"):
        tpu_backend.load(tmp_path / "missing.tpuexp")


# ---------------------------------------------------------------------------------- golden

class TinyMLP(torch.nn.Module):
    """The golden model. Since format 3 it has an embedding, so ``ids`` carries an index_bound
    (goldens of formats 1 and 2 were made before; their io.json files hold their own outputs)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.emb = torch.nn.Embedding(4, 8)

    def forward(self, x, ids):
        h = torch.tanh(self.fc1(x)) * (ids.unsqueeze(-1) + 1) + self.emb(ids)
        return {"y": self.fc2(h), "top": h.argmax(-1)}


def _golden_program():
    """The golden model, its sample inputs and its Program, exactly as the golden was made."""
    torch.manual_seed(0)
    model = TinyMLP().eval()
    g = torch.Generator().manual_seed(1)
    x, ids = torch.randn(3, 4, generator=g), torch.randint(0, 4, (3,), generator=g)
    b = torch.export.Dim("batch", min=1, max=16)
    return model, x, ids, converter.prepare(model, (x, ids), dynamic_shapes=({0: b}, {0: b}))


def make_golden(out_dir: Path) -> None:
    """Regenerate the golden artifact: ``python -m tests.tpu.test_artifact`` (only when the
    format version changes; keep the old one too, under its version, so old files stay tested)."""
    model, x, ids, prog = _golden_program()
    path = out_dir / f"tiny_mlp_v{tpu_backend.FORMAT_VERSION}.tpuexp.zip"
    tpu_backend.export_program(prog).save(path)
    with torch.no_grad():
        ref = model(x, ids)
    io = {"inputs": {"x": x.tolist(), "ids": ids.tolist()},
          "outputs": {"y": ref["y"].tolist(), "top": ref["top"].tolist()}}
    (out_dir / f"tiny_mlp_v{tpu_backend.FORMAT_VERSION}.io.json").write_text(json.dumps(io, indent=1))


@pytest.mark.parametrize("artifact", sorted(GOLDEN.glob("*.tpuexp.zip")), ids=lambda p: p.name)
def test_golden_artifacts_still_load_and_run(artifact):
    assert artifact.stat().st_size < 100_000
    io = json.loads(Path(str(artifact).replace(".tpuexp.zip", ".io.json")).read_text())
    prog = tpu_backend.load(artifact)
    x = torch.tensor(io["inputs"]["x"], dtype=torch.float32)
    ids = torch.tensor(io["inputs"]["ids"], dtype=torch.int64)
    out = prog(x, ids)
    ref = {"y": torch.tensor(io["outputs"]["y"]), "top": torch.tensor(io["outputs"]["top"], dtype=torch.int32)}
    assert_close_tree(out, ref, 1e-5)


def test_golden_exists_for_the_current_version():
    assert (GOLDEN / f"tiny_mlp_v{tpu_backend.FORMAT_VERSION}.tpuexp.zip").exists(), \
        "run `python -m tests.tpu.test_artifact` to add the golden artifact of this format version"


def test_resaved_golden_model_records_the_golden_manifest_text(tmp_path):
    """Signature specs are objects in memory and JSON only in the manifest: re-exporting the golden
    model writes its signatures and weight table as the golden did, key order included."""
    golden = GOLDEN / f"tiny_mlp_v{tpu_backend.FORMAT_VERSION}.tpuexp.zip"
    path = tpu_backend.export_program(_golden_program()[3]).save(tmp_path / "again.tpuexp.zip")
    old, new = (json.loads(zipfile.ZipFile(p).read("manifest.json")) for p in (golden, path))
    for key in ("signatures", "weights"):
        assert json.dumps(new[key], indent=2) == json.dumps(old[key], indent=2)


def test_loaded_specs_are_frozen_and_round_trip_their_manifest_entries():
    from tpu_export.tpu_backend.artifact.specs import ArtifactTensorSpec

    golden = GOLDEN / f"tiny_mlp_v{tpu_backend.FORMAT_VERSION}.tpuexp.zip"
    art = tpu_backend.read_artifact(golden)
    sig = art.signatures["serving_default"]
    x, ids = sig.inputs
    assert (x.name, x.shape, x.dtype, x.index_bound) == ("x", ("batch", 4), "float32", None)
    assert (ids.name, ids.index_bound, ids.sharding) == ("ids", 4, None)
    with pytest.raises(AttributeError):
        ids.index_bound = 5  # frozen: a runtime cannot change what the artifact checks
    entries = art.manifest["signatures"]["serving_default"]
    assert [s.to_json() for s in sig.inputs + sig.outputs] == entries["inputs"] + entries["outputs"]
    sharded = {"name": "x", "shape": ["batch", 16], "dtype": "bfloat16", "sharding": ["data", ["model", "seq"]],
               "jax_shape": ["2*batch_per_data", 16]}
    spec = ArtifactTensorSpec.from_json(sharded)
    assert spec.sharding == ("data", ("model", "seq")) and hash(spec) == hash(ArtifactTensorSpec.from_json(sharded))
    assert json.dumps(spec.to_json()) == json.dumps(sharded)
    assert spec.check_spec == {"name": "x", "shape": ["batch", 16], "dtype": "bfloat16", "index_bound": None}


if __name__ == "__main__":
    make_golden(GOLDEN)
