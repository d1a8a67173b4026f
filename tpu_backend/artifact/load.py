"""Read and validate an artifact: version window, manifest schema and digest, every file's
size and sha256, then the exports and weights cross-checked against the manifest.

Nothing in the artifact is executed or unpickled: the manifest is JSON, exports are
jax.export's flatbuffer + StableHLO bytecode, weights are safetensors (parsed here), and
compiled executables are hashed like every file but their bytes are read only when the caller
opts in (``load_executables``), and only those compiled for platform "tpu".

Order matters against hostile files: the container refuses links, special files and compressed
zip entries before anything is read; the manifest is size-capped, depth-checked and
schema-checked; every other file's size is compared with the manifest before a byte of it is
read, and each read stops at that size. The StableHLO of each export is parsed here so that a
corrupt module fails at load, naming its file, rather than at the first call.
jaxlib's parser is not hardened against a re-signed hostile module (it can crash or hang the
process): ``isolate=True`` runs that parse in a child process first (isolated_parse.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re

from tpu_export.converter.errors import one_line

from . import format as fmt
from .compiled import CompiledSignature, CompiledTarget
from .container import open_container
from .errors import ArtifactCorruptError, ManifestError
from .safetensors_io import read_safetensors
from .specs import ArtifactTensorSpec

__all__ = ["TpuArtifact", "read_artifact"]

_MAX_MANIFEST = 16 * 1024 * 1024  # a 10k-weight model's manifest is ~2 MB
_MAX_REPORT = 16 * 1024 * 1024


@dataclasses.dataclass
class LoadedSignature:
    name: str
    exported: object  # jax.export.Exported
    weight_names: list[str]
    inputs: list[ArtifactTensorSpec]
    outputs: list[ArtifactTensorSpec]
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


def read_artifact(path, *, verify: bool = True, load_executables: bool = False, isolate: bool = False,
                  isolate_timeout: float = 30.0) -> TpuArtifact:
    """Read and check an artifact. ``load_executables`` reads the bytes of its TPU executables
    (for a runtime that was told to trust them); otherwise they are only hashed. ``isolate``
    first parses each export's StableHLO in a child process, ``isolate_timeout`` seconds each
    (jaxlib's parser can crash or hang on hostile bytes; see isolated_parse): ~1-2 s per load."""
    path = os.fspath(path)
    box = open_container(path)
    try:
        return _read(box, path, verify, load_executables, isolate_timeout if isolate else None)
    finally:
        box.close()


def _read(box, path, verify, load_executables, isolate_timeout=None) -> TpuArtifact:
    listing = box.listing()
    if "manifest.json" not in listing:
        raise ArtifactCorruptError(f"{path}: manifest.json is missing (not an artifact, or truncated)")
    if listing["manifest.json"] > _MAX_MANIFEST:
        raise ManifestError(f"{path}: manifest.json is {listing['manifest.json']} bytes (over {_MAX_MANIFEST}); "
                            "refusing to parse it")
    manifest = fmt.parse_json(box.read("manifest.json", listing["manifest.json"]), f"{path}: manifest.json")
    try:
        fmt.check_version(manifest)
        fmt.validate_manifest(manifest)
    except ManifestError as e:  # ArtifactVersionError too: name the artifact
        raise type(e)(f"{path}: {e}") from None

    files = manifest["files"]
    extra = sorted(set(listing) - set(files) - {"manifest.json"})
    if extra:
        raise ArtifactCorruptError(f"{path}: files not recorded in the manifest: {extra[:10]}")
    for rel, e in files.items():  # every size first: nothing else is read from a mismatched artifact
        if rel not in listing:
            raise ArtifactCorruptError(f"{path}: {rel} is missing")
        if listing[rel] != e["size"]:
            raise ArtifactCorruptError(f"{path}: {rel} is {listing[rel]} bytes, the manifest records "
                                       f"{e['size']}: truncated or corrupted")
    # Each export is read once: the bytes hashed here are the bytes parsed in the child (isolate) and here.
    exports = dict.fromkeys(s["file"] for s in manifest["signatures"].values())
    hashed = {}
    if verify:
        for rel, e in files.items():
            if rel in exports:
                hashed[rel] = box.read(rel, e["size"])
                got = hashlib.sha256(hashed[rel]).hexdigest()
            else:
                got = box.sha256(rel, e["size"])
            if got != e["sha256"]:
                raise ArtifactCorruptError(f"{path}: {rel} does not match its recorded sha256 "
                                           f"(expected {e['sha256'][:16]}..., got {got[:16]}...): "
                                           "the file is corrupted")
    raw = {rel: hashed[rel] if rel in hashed else box.read(rel, files[rel]["size"]) for rel in exports}
    if isolate_timeout is not None:
        from .isolated_parse import parse_exports_isolated

        parse_exports_isolated(path, list(raw.items()), isolate_timeout)
    sigs = {}
    for name, s in manifest["signatures"].items():
        exp = _read_export(path, s["file"], raw[s["file"]])
        _cross_check(name, s, manifest, exp, path)
        sigs[name] = LoadedSignature(name, exp, s["weight_names"],
                                     [ArtifactTensorSpec.from_json(t) for t in s["inputs"]],
                                     [ArtifactTensorSpec.from_json(t) for t in s["outputs"]],
                                     s["input_structure"], s["output_structure"], s["dim_ranges"])

    wfile = manifest["weights"]["file"]
    weights = read_safetensors(*box.span(wfile), what=f"{path}: {wfile}")
    table = manifest["weights"]["tensors"]
    if set(weights) != set(table):
        raise ArtifactCorruptError(f"{path}: {wfile} holds {sorted(weights)[:10]}, the manifest lists "
                                   f"{sorted(table)[:10]}")
    for name, t in table.items():
        a = weights[name]
        if list(a.shape) != t["shape"] or str(a.dtype) != t["dtype"]:
            raise ArtifactCorruptError(f"{path}: {wfile}: {name!r} is {a.dtype}{list(a.shape)}, the manifest "
                                       f"records {t['dtype']}{t['shape']}")

    compiled = []
    for c in manifest["compiled"]:
        rel = c["report"]
        if files[rel]["size"] > _MAX_REPORT:
            raise ArtifactCorruptError(f"{path}: {rel} is {files[rel]['size']} bytes (over {_MAX_REPORT}); "
                                       "refusing to parse it")
        report = fmt.parse_json(box.read(rel, files[rel]["size"]), f"{path}: {rel}", ArtifactCorruptError)
        if not isinstance(report, dict):
            raise ArtifactCorruptError(f"{path}: {rel} is not a JSON object")
        # Executables are machine code: their bytes are read only on request, and never for a
        # platform other than "tpu" (a CPU executable in an artifact is not ours to run).
        read = load_executables and c["platform"] == "tpu"
        csigs = {n: CompiledSignature(box.read(e["file"], files[e["file"]]["size"]) if read else None,
                                      e["input_shapes"], e.get("compile_seconds", 0.0))
                 for n, e in c["signatures"].items()}
        compiled.append(CompiledTarget(c["target"], c["topology"], c["platform"], c["device_kind"],
                                       c["num_devices"], c.get("versions", {}), csigs, report))
    return TpuArtifact(path, manifest, sigs, weights, compiled)


def _read_export(path, rel, data):
    """A jax export whose StableHLO module parses (a corrupt one fails here, not at the first call)."""
    from jax import export

    try:
        exp = export.deserialize(bytearray(data))
        text = exp.mlir_module()  # deserializes the StableHLO bytecode: ~10 ms for a ViT-sized module
    except ArtifactCorruptError:
        raise
    except Exception as e:  # noqa: BLE001 - any parse failure is a corrupt file
        msg = one_line(e)
        raise ArtifactCorruptError(f"{path}: {rel}: not a readable jax export ({type(e).__name__}: {msg})") from None
    if not re.search(r"func\.func public @main\(", text):  # empty bytes parse as an empty module
        raise ArtifactCorruptError(f"{path}: {rel}: its StableHLO module has no public main function; corrupted")
    return exp


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
