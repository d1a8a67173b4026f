"""The artifact format: version window, manifest schema and its digest.

Changelog of FORMAT_VERSION (bump it for any change a previous loader would misread, and
keep MIN_READABLE_VERSION at the oldest version this loader still reads correctly):

  1  first release: manifest.json, signatures/<name>.jaxexport (jax.export serialization),
     weights.safetensors, optional compiled/<target>-<topology>/<signature>.bin (raw PJRT
     executable bytes, no pickle) with report.json (cost and memory analysis).
  2  adds "quant": null, or {"scheme": "weight_only_int8", "weights": {name: {"int8": ..., "scale": ...}}}
     naming, for each quantized program weight, the int8 tensor and the per-channel f32 scales that
     replace it in the weights table. A version-1 manifest reads as "quant": null.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Any

from . import structure
from .dtypes import DTYPE_NAMES
from .errors import ArtifactVersionError, ManifestError

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MIN_READABLE_VERSION", "manifest_digest", "check_version",
           "validate_manifest", "safe_relpath"]

FORMAT_NAME = "tpu-export.tpuexp"
FORMAT_VERSION = 2
MIN_READABLE_VERSION = 1
QUANT_SCHEMES = ("weight_only_int8",)

_TOP_KEYS = {"format", "format_version", "created_by", "program_fingerprint", "platforms", "dtype",
             "enable_x64", "mesh", "partition_rules", "weights", "signatures", "compiled", "files",
             "manifest_sha256", "quant"}
_SINCE = {"quant": 2}  # fields added after version 1, by the version that added them
_PLATFORMS = {"tpu", "cpu", "cuda", "rocm"}


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON, without the digest field itself."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_version(manifest: Any) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise ManifestError(f"manifest.json does not describe a {FORMAT_NAME} artifact "
                            f"(format field: {manifest.get('format') if isinstance(manifest, dict) else None!r})")
    v = manifest.get("format_version")
    if not isinstance(v, int) or isinstance(v, bool) or not MIN_READABLE_VERSION <= v <= FORMAT_VERSION:
        newer = isinstance(v, int) and v > FORMAT_VERSION
        raise ArtifactVersionError(
            f"artifact format version {v!r} is not supported: this loader reads versions "
            f"{MIN_READABLE_VERSION} to {FORMAT_VERSION}. "
            + ("Upgrade tpu-export to read it." if newer else "Re-export the model with this tpu-export.")
        )


def safe_relpath(p: Any, where: str) -> str:
    """A relative POSIX path inside the artifact (no '..', no absolute paths, no backslashes)."""
    if not isinstance(p, str) or not p or p.startswith("/") or "\\" in p or p != posixpath.normpath(p) \
            or p.split("/")[0] == ".." or not re.fullmatch(r"[\w.\-/]+", p):
        raise ManifestError(f"manifest.json: {where}: {p!r} is not a safe relative path")
    return p


def validate_manifest(m: dict) -> None:
    """Schema and consistency checks; ManifestError naming the first field that is wrong."""

    def need(cond, msg):
        if not cond:
            raise ManifestError(f"manifest.json: {msg}")

    extra = set(m) - _TOP_KEYS
    need(not extra, f"unexpected fields {sorted(extra)}")
    version = m.get("format_version") if isinstance(m.get("format_version"), int) else FORMAT_VERSION
    missing = _TOP_KEYS - set(m) - {"partition_rules"} - {k for k, v in _SINCE.items() if version < v}
    need(not missing, f"missing fields {sorted(missing)}")
    late = [k for k, v in _SINCE.items() if k in m and version < v]
    need(not late, f"fields {late} do not exist in format version {version}")
    need(m["manifest_sha256"] == manifest_digest(m),
         "its content does not match its recorded digest (manifest_sha256): the manifest was edited "
         "after it was written. Re-export the model rather than editing the manifest.")
    files = m["files"]
    need(isinstance(files, dict) and files, "files must be a non-empty object")
    for p, e in files.items():
        safe_relpath(p, "files")
        need(isinstance(e, dict) and isinstance(e.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", e["sha256"])
             and isinstance(e.get("size"), int) and e["size"] >= 0, f"files[{p!r}] needs a sha256 and a size")
    need(isinstance(m["platforms"], list) and m["platforms"] and set(m["platforms"]) <= _PLATFORMS,
         f"platforms {m['platforms']!r} must be a list drawn from {sorted(_PLATFORMS)}")
    need(m["dtype"] in (None, "bfloat16", "float16", "float32"), f"dtype {m['dtype']!r} is not supported")
    need(isinstance(m["program_fingerprint"], str), "program_fingerprint must be a string")
    mesh = m["mesh"]
    if mesh is not None:
        need(isinstance(mesh, dict) and isinstance(mesh.get("axis_names"), list) and isinstance(mesh.get("shape"), list)
             and len(mesh["axis_names"]) == len(mesh["shape"]) and all(isinstance(s, int) and s > 0 for s in mesh["shape"]),
             "mesh must have matching axis_names and shape")
    axes = set(mesh["axis_names"]) if mesh else set()

    w = m["weights"]
    need(isinstance(w, dict) and isinstance(w.get("file"), str) and isinstance(w.get("tensors"), dict),
         "weights must have a file and a tensors table")
    need(w["file"] in files, f"weights file {w['file']!r} is not listed in files")
    for name, t in w["tensors"].items():
        _check_tensor(t, f"weights.tensors[{name!r}]", axes, need, dynamic=False)

    q = m.get("quant")
    if q is not None:
        need(isinstance(q, dict) and q.get("scheme") in QUANT_SCHEMES and isinstance(q.get("weights"), dict),
             f"quant must name a scheme from {list(QUANT_SCHEMES)} and its weights")
        for name, e in q["weights"].items():
            need(isinstance(e, dict) and w["tensors"].get(e.get("int8"), {}).get("dtype") == "int8"
                 and w["tensors"].get(e.get("scale"), {}).get("dtype") == "float32",
                 f"quant.weights[{name!r}] must name an int8 tensor and a float32 scale of the weights table")

    sigs = m["signatures"]
    need(isinstance(sigs, dict) and sigs, "signatures must be a non-empty object")
    for name, s in sigs.items():
        where = f"signatures[{name!r}]"
        need(isinstance(s, dict), f"{where} must be an object")
        need(s.get("file") in files, f"{where}.file {s.get('file')!r} is not listed in files")
        need(isinstance(s.get("weight_names"), list) and all(n in w["tensors"] for n in s["weight_names"]),
             f"{where}.weight_names must name weights of the weights table")
        for key in ("inputs", "outputs"):
            need(isinstance(s.get(key), list), f"{where}.{key} must be a list")
            for i, t in enumerate(s[key]):
                _check_tensor(t, f"{where}.{key}[{i}]", axes, need, dynamic=True)
        for key, specs in (("input_structure", "inputs"), ("output_structure", "outputs")):
            try:
                structure.validate(s.get(key), f"{where}.{key}")
            except ValueError as e:
                raise ManifestError(f"manifest.json: {e}") from None
            need(structure.leaf_names(s[key]) == [t["name"] for t in s[specs]],
                 f"{where}.{key} leaves do not match its {specs}")
        need(isinstance(s.get("dim_ranges"), dict) and all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r) and r[0] <= r[1]
            for r in s["dim_ranges"].values()), f"{where}.dim_ranges must map dim names to [min, max]")

    need(isinstance(m["compiled"], list), "compiled must be a list")
    for i, c in enumerate(m["compiled"]):
        where = f"compiled[{i}]"
        need(isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("target", "topology", "platform",
                                                                              "device_kind", "report")),
             f"{where} needs target, topology, platform, device_kind and report")
        need(c["report"] in files, f"{where}.report {c['report']!r} is not listed in files")
        need(isinstance(c.get("num_devices"), int) and c["num_devices"] > 0, f"{where}.num_devices must be > 0")
        need(isinstance(c.get("signatures"), dict), f"{where}.signatures must be an object")
        for sname, e in c["signatures"].items():
            need(sname in sigs, f"{where} compiles unknown signature {sname!r}")
            need(isinstance(e, dict) and e.get("file") in files, f"{where}.signatures[{sname!r}].file is not listed")
            need(isinstance(e.get("input_shapes"), list) and all(
                isinstance(sh, list) and all(isinstance(d, int) for d in sh) for sh in e["input_shapes"]),
                f"{where}.signatures[{sname!r}].input_shapes must be lists of ints")


def _check_tensor(t, where, axes, need, dynamic):
    need(isinstance(t, dict), f"{where} must be an object")
    if dynamic:
        need(isinstance(t.get("name"), str), f"{where}.name must be a string")
    need(t.get("dtype") in DTYPE_NAMES, f"{where}.dtype {t.get('dtype')!r} is not a known dtype")
    shape = t.get("shape")
    need(isinstance(shape, list) and all(
        (isinstance(d, int) and not isinstance(d, bool) and d >= 0) or (dynamic and isinstance(d, str) and d)
        for d in shape), f"{where}.shape {shape!r} is malformed")
    sh = t.get("sharding")
    if sh is not None:
        need(isinstance(sh, list) and len(sh) == len(shape), f"{where}.sharding must have one entry per dim")
        for e in sh:
            names = [] if e is None else [e] if isinstance(e, str) else e
            need(isinstance(names, list) and all(isinstance(a, str) and a in axes for a in names),
                 f"{where}.sharding {sh!r} names axes outside the mesh")
