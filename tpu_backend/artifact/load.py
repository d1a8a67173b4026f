"""Read and validate an artifact: version window, manifest schema and digest, every file's
size and sha256, then the exports and weights cross-checked against the manifest.

Nothing in the artifact is executed or unpickled: the manifest is JSON, exports are
jax.export's flatbuffer + StableHLO bytecode, weights are safetensors (parsed here), and
compiled executables stay bytes until a runtime on the matching TPU chooses to load them.
"""

from __future__ import annotations

import dataclasses
import json
import os

from . import format as fmt
from .compiled import CompiledSignature, CompiledTarget
from .container import open_container
from .errors import ArtifactCorruptError, ManifestError
from .safetensors_io import read_safetensors

__all__ = ["TpuArtifact", "read_artifact"]

_MAX_MANIFEST = 64 * 1024 * 1024


@dataclasses.dataclass
class LoadedSignature:
    name: str
    exported: object  # jax.export.Exported
    weight_names: list[str]
    inputs: list[dict]
    outputs: list[dict]
    input_structure: dict
    output_structure: dict
    dim_ranges: dict


@dataclasses.dataclass
class TpuArtifact:
    path: str
    manifest: dict
    signatures: dict[str, LoadedSignature]
    weights: dict  # name -> numpy array (memory-mapped where the container allows)
    compiled: list[CompiledTarget]

    @property
    def format_version(self) -> int:
        return self.manifest["format_version"]

    def reports(self) -> dict[str, dict]:
        return {c.key: c.report for c in self.compiled}


def read_artifact(path, *, verify: bool = True) -> TpuArtifact:
    path = os.fspath(path)
    box = open_container(path)
    try:
        return _read(box, path, verify)
    finally:
        box.close()


def _read(box, path, verify) -> TpuArtifact:
    listing = box.listing()
    if "manifest.json" not in listing:
        raise ArtifactCorruptError(f"{path}: manifest.json is missing (not an artifact, or truncated)")
    if listing["manifest.json"] > _MAX_MANIFEST:
        raise ManifestError(f"{path}: manifest.json is {listing['manifest.json']} bytes; refusing to parse it")
    try:
        manifest = json.loads(box.read("manifest.json"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path}: manifest.json is not valid JSON ({e}); truncated or edited") from None
    fmt.check_version(manifest)
    fmt.validate_manifest(manifest)

    files = manifest["files"]
    extra = sorted(set(listing) - set(files) - {"manifest.json"})
    if extra:
        raise ArtifactCorruptError(f"{path}: files not recorded in the manifest: {extra}")
    for rel, e in files.items():
        if rel not in listing:
            raise ArtifactCorruptError(f"{path}: {rel} is missing")
        if listing[rel] != e["size"]:
            raise ArtifactCorruptError(f"{path}: {rel} is {listing[rel]} bytes, the manifest records "
                                       f"{e['size']}: truncated or corrupted")
        if verify:
            got = box.sha256(rel)
            if got != e["sha256"]:
                raise ArtifactCorruptError(f"{path}: {rel} does not match its recorded sha256 "
                                           f"(expected {e['sha256'][:16]}..., got {got[:16]}...): the file is corrupted")

    from jax import export

    sigs = {}
    for name, s in manifest["signatures"].items():
        try:
            exp = export.deserialize(bytearray(box.read(s["file"])))
        except Exception as e:  # noqa: BLE001 - any parse failure is a corrupt file
            raise ArtifactCorruptError(f"{path}: {s['file']}: not a readable jax export ({e})") from None
        _cross_check(name, s, manifest, exp, path)
        sigs[name] = LoadedSignature(name, exp, s["weight_names"], s["inputs"], s["outputs"],
                                     s["input_structure"], s["output_structure"], s["dim_ranges"])

    wfile = manifest["weights"]["file"]
    span = box.span(wfile)
    if span is None:
        raise ArtifactCorruptError(f"{path}: {wfile} is compressed inside the zip; artifacts store it "
                                   "uncompressed so it can be memory-mapped")
    weights = read_safetensors(*span, what=f"{path}: {wfile}")
    table = manifest["weights"]["tensors"]
    if set(weights) != set(table):
        raise ArtifactCorruptError(f"{path}: {wfile} holds {sorted(weights)}, the manifest lists {sorted(table)}")
    for name, t in table.items():
        a = weights[name]
        if list(a.shape) != t["shape"] or str(a.dtype) != t["dtype"]:
            raise ArtifactCorruptError(f"{path}: {wfile}: {name!r} is {a.dtype}{list(a.shape)}, the manifest "
                                       f"records {t['dtype']}{t['shape']}")

    compiled = []
    for c in manifest["compiled"]:
        try:
            report = json.loads(box.read(c["report"]))
        except ValueError as e:
            raise ArtifactCorruptError(f"{path}: {c['report']} is not valid JSON ({e})") from None
        csigs = {n: CompiledSignature(box.read(e["file"]), e["input_shapes"], e.get("compile_seconds", 0.0))
                 for n, e in c["signatures"].items()}
        compiled.append(CompiledTarget(c["target"], c["topology"], c["platform"], c["device_kind"],
                                       c["num_devices"], c.get("versions", {}), csigs, report))
    return TpuArtifact(path, manifest, sigs, weights, compiled)


def _cross_check(name, s, manifest, exp, path):
    """The manifest's view of a signature must agree with the export it points to."""
    from .dtypes import name_to_numpy

    w = manifest["weights"]["tensors"]
    want = [(w[n]["dtype"], w[n]["shape"]) for n in s["weight_names"]] + [(t["dtype"], t["shape"]) for t in s["inputs"]]
    avals = exp.in_avals
    if len(avals) != len(want):
        raise ManifestError(f"{path}: manifest.json: signature {name!r} lists {len(want)} arguments, "
                            f"its export takes {len(avals)}")
    for i, (a, (dt, shape)) in enumerate(zip(avals, want)):
        same = a.dtype == name_to_numpy(dt) and len(a.shape) == len(shape) and all(
            (isinstance(m, int) and isinstance(e, int) and m == e) or (isinstance(m, str) and not isinstance(e, int))
            for m, e in zip(shape, a.shape))
        if not same:
            raise ManifestError(f"{path}: manifest.json: signature {name!r} argument {i} is recorded as "
                                f"{dt}{shape} but its export takes {a.dtype}[{','.join(map(str, a.shape))}]")
    if len(exp.out_avals) != len(s["outputs"]):
        raise ManifestError(f"{path}: manifest.json: signature {name!r} lists {len(s['outputs'])} outputs, "
                            f"its export returns {len(exp.out_avals)}")
    if not set(exp.platforms) <= set(manifest["platforms"]) or not set(manifest["platforms"]) <= set(exp.platforms):
        raise ManifestError(f"{path}: manifest.json: platforms {manifest['platforms']} disagree with the export's "
                            f"{list(exp.platforms)}")
