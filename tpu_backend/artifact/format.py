"""The artifact format: version window, manifest schema and its digest.

Changelog of FORMAT_VERSION (bump it for any change a previous loader would misread, and
keep MIN_READABLE_VERSION at the oldest version this loader still reads correctly):

  1  first release: manifest.json, signatures/<name>.jaxexport (jax.export serialization),
     weights.safetensors, optional compiled/<target>-<topology>/<signature>.bin (raw PJRT
     executable bytes, no pickle) with report.json (cost and memory analysis).
  2  adds "quant": null, or {"scheme": "weight_only_int8", "weights": {name: {"int8": ..., "scale": ...}}}
     naming, for each quantized program weight, the int8 tensor and the per-channel f32 scales that
     replace it in the weights table. A version-1 manifest reads as "quant": null.
  3  an input of a signature may carry "index_bound": n (an int > 0): the input holds ids into an
     embedding of n rows, so valid ids are [0, n) and the runtime checks them as torch does. Older
     loaders would ignore it and let out-of-range ids clamp silently; v1/v2 manifests may not have it.
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

__all__ = ["PLATFORMS", "FORMAT_NAME", "FORMAT_VERSION", "MIN_READABLE_VERSION", "manifest_digest", "check_version",
           "validate_manifest", "safe_relpath", "parse_json", "MAX_JSON_DEPTH"]

FORMAT_NAME = "tpu-export.tpuexp"
FORMAT_VERSION = 3
MIN_READABLE_VERSION = 1
QUANT_SCHEMES = ("weight_only_int8",)

_TOP_KEYS = {"format", "format_version", "created_by", "program_fingerprint", "platforms", "dtype",
             "enable_x64", "mesh", "partition_rules", "weights", "signatures", "compiled", "files",
             "manifest_sha256", "quant"}
_SINCE = {"quant": 2}  # fields added after version 1, by the version that added them
_INPUT_SINCE = {"index_bound": 3}  # fields of signatures[*].inputs[*], likewise
# jax.export platforms an artifact may be lowered for (tpu_backend.export.PLATFORMS is this tuple)
PLATFORMS = ("tpu", "cpu", "cuda", "rocm")
_MAX_INT = 2**62  # sizes, dims, counts: far above any real artifact, far below overflow anywhere
MAX_JSON_DEPTH = 64  # the writer nests a few levels plus two per level of a signature's pytree


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON, without the digest field itself."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def parse_json(data: bytes, what: str, error=ManifestError) -> Any:
    """JSON from the artifact, nested at most MAX_JSON_DEPTH deep (every later walk of it,
    the digest's json.dumps included, recurses): ``error`` naming ``what`` otherwise."""
    try:
        obj = json.loads(data)
    except RecursionError:
        obj = None  # json's C parser refuses nesting near the interpreter's recursion limit
    except (ValueError, UnicodeDecodeError) as e:  # a 5000-digit number is a ValueError too
        raise error(f"{what} is not valid JSON ({e}); truncated or edited") from None
    todo, deep = [(obj, 1)], obj is None
    while todo and not deep:
        o, d = todo.pop()
        kids = o.values() if isinstance(o, dict) else o if isinstance(o, list) else ()
        if kids and d >= MAX_JSON_DEPTH:
            deep = True
        todo.extend((k, d + 1) for k in kids)
    if deep:
        raise error(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep; not an artifact's JSON")
    return obj


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


def _int(v, lo=0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= _MAX_INT


def _strs(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def validate_manifest(m: dict) -> None:
    """Schema and consistency checks of a parsed manifest (a dict that passed check_version):
    every field's type is checked before it is used, so anything malformed is a ManifestError
    naming the first field that is wrong, never a TypeError or KeyError."""

    def need(cond, msg):
        if not cond:
            raise ManifestError(f"manifest.json: {msg}")

    extra = set(m) - _TOP_KEYS
    need(not extra, f"unexpected fields {sorted(extra)}")
    version = m.get("format_version") if _int(m.get("format_version")) else FORMAT_VERSION
    missing = _TOP_KEYS - set(m) - {"partition_rules"} - {k for k, v in _SINCE.items() if version < v}
    need(not missing, f"missing fields {sorted(missing)}")
    late = [k for k, v in _SINCE.items() if k in m and version < v]
    need(not late, f"fields {late} do not exist in format version {version}")
    need(isinstance(m["manifest_sha256"], str) and m["manifest_sha256"] == manifest_digest(m),
         "its content does not match its recorded digest (manifest_sha256): the manifest was edited "
         "after it was written. Re-export the model rather than editing the manifest.")
    files = m["files"]
    need(isinstance(files, dict) and files, "files must be a non-empty object")
    for p, e in files.items():
        safe_relpath(p, "files")
        need(p != "manifest.json", "files may not list manifest.json itself")
        need(isinstance(e, dict) and isinstance(e.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", e["sha256"])
             and _int(e.get("size")), f"files[{p!r}] needs a sha256 (64 hex digits) and a size (an int >= 0)")
    cb = m["created_by"]
    need(isinstance(cb, dict) and all(v is None or isinstance(v, str) for v in cb.values()),
         "created_by must map package names to version strings")
    need(isinstance(m["platforms"], list) and m["platforms"] and _strs(m["platforms"])
         and set(m["platforms"]) <= set(PLATFORMS), f"platforms {m['platforms']!r:.80} must be a list drawn from "
         f"{sorted(PLATFORMS)}")
    need(m["dtype"] in (None, "bfloat16", "float16", "float32"), f"dtype {m['dtype']!r:.80} is not supported")
    need(isinstance(m["enable_x64"], bool), "enable_x64 must be true or false")
    need(isinstance(m["program_fingerprint"], str), "program_fingerprint must be a string")
    mesh = m["mesh"]
    if mesh is not None:
        need(isinstance(mesh, dict) and set(mesh) == {"axis_names", "shape"} and _strs(mesh["axis_names"])
             and isinstance(mesh["shape"], list) and len(mesh["axis_names"]) == len(mesh["shape"])
             and len(set(mesh["axis_names"])) == len(mesh["axis_names"]) and all(_int(s, 1) for s in mesh["shape"]),
             "mesh must have distinct axis_names and a shape of ints > 0, one per axis")
    axes = set(mesh["axis_names"]) if mesh else set()
    _check_rules(m.get("partition_rules"), need)

    w = m["weights"]
    need(isinstance(w, dict) and isinstance(w.get("file"), str) and isinstance(w.get("tensors"), dict),
         "weights must have a file and a tensors table")
    need(w["file"] in files, f"weights file {w['file']!r:.80} is not listed in files")
    tensors = w["tensors"]
    for name, t in tensors.items():
        _check_tensor(t, f"weights.tensors[{name!r}]", axes, need, dynamic=False, version=version)

    q = m.get("quant")
    if q is not None:
        need(isinstance(q, dict) and q.get("scheme") in QUANT_SCHEMES and isinstance(q.get("weights"), dict),
             f"quant must name a scheme from {list(QUANT_SCHEMES)} and its weights")
        for name, e in q["weights"].items():
            parts = [e.get(k) if isinstance(e, dict) else None for k in ("int8", "scale")]
            need(all(isinstance(p, str) and isinstance(tensors.get(p), dict) for p in parts)
                 and tensors[parts[0]]["dtype"] == "int8" and tensors[parts[1]]["dtype"] == "float32",
                 f"quant.weights[{name!r}] must name an int8 tensor and a float32 scale of the weights table")

    sigs = m["signatures"]
    need(isinstance(sigs, dict) and sigs, "signatures must be a non-empty object")
    for name, s in sigs.items():
        _check_signature(name, s, files, tensors, axes, need, version)

    need(isinstance(m["compiled"], list), "compiled must be a list")
    for i, c in enumerate(m["compiled"]):
        _check_compiled(f"compiled[{i}]", c, files, sigs, need)


def _check_rules(rules, need):
    """partition_rules: how the writer sharded the weights (a record; nothing is run from it)."""
    if rules is None:
        return
    need(isinstance(rules, dict) and set(rules) <= {"weights", "data_axis"}
         and (rules.get("data_axis") is None or isinstance(rules["data_axis"], str))
         and isinstance(rules.get("weights", []), list)
         and all(isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], list)
                 for r in rules.get("weights", [])),
         "partition_rules must be {\"weights\": [[pattern, spec], ...], \"data_axis\": name or null}")


def _check_signature(name, s, files, tensors, axes, need, version):
    where = f"signatures[{name!r}]"
    need(isinstance(s, dict), f"{where} must be an object")
    need(isinstance(s.get("file"), str) and s["file"] in files,
         f"{where}.file {s.get('file')!r:.80} is not listed in files")
    need(_strs(s.get("weight_names")) and all(n in tensors for n in s["weight_names"]),
         f"{where}.weight_names must name weights of the weights table")
    for key in ("inputs", "outputs"):
        need(isinstance(s.get(key), list), f"{where}.{key} must be a list")
        for i, t in enumerate(s[key]):
            _check_tensor(t, f"{where}.{key}[{i}]", axes, need, dynamic=True, version=version,
                          is_input=key == "inputs")
    for key, specs in (("input_structure", "inputs"), ("output_structure", "outputs")):
        try:
            structure.validate(s.get(key), f"{where}.{key}")
        except ValueError as e:
            raise ManifestError(f"manifest.json: {e}") from None
        need(structure.leaf_names(s[key]) == [t["name"] for t in s[specs]],
             f"{where}.{key} leaves do not match its {specs}")
    ranges = s.get("dim_ranges")
    need(isinstance(ranges, dict) and all(
        isinstance(r, list) and len(r) == 2 and all(_int(v) for v in r) and r[0] <= r[1]
        for r in ranges.values()), f"{where}.dim_ranges must map dim names to [min, max], ints >= 0")


def _check_compiled(where, c, files, sigs, need):
    need(isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("target", "topology", "platform",
                                                                          "device_kind", "report")),
         f"{where} needs target, topology, platform, device_kind and report (strings)")
    # Any known platform is accepted here, so artifacts with a CPU compile (tests, older tools)
    # still read; the runtime never loads an executable whose platform is not "tpu".
    need(c["platform"] in PLATFORMS, f"{where}.platform {c['platform']!r:.80} is not one of {sorted(PLATFORMS)}")
    need(c["report"] in files, f"{where}.report {c['report']!r:.80} is not listed in files")
    need(_int(c.get("num_devices"), 1), f"{where}.num_devices must be an int > 0")
    v = c.get("versions", {})
    need(isinstance(v, dict) and all(x is None or isinstance(x, str) for x in v.values()),
         f"{where}.versions must map package names to version strings")
    need(isinstance(c.get("signatures"), dict), f"{where}.signatures must be an object")
    for sname, e in c["signatures"].items():
        at = f"{where}.signatures[{sname!r}]"
        need(sname in sigs, f"{where} compiles unknown signature {sname!r}")
        need(isinstance(e, dict) and isinstance(e.get("file"), str) and e["file"] in files,
             f"{at}.file is not listed in files")
        need(isinstance(e.get("input_shapes"), list) and all(
            isinstance(sh, list) and all(_int(d) for d in sh) for sh in e["input_shapes"]),
            f"{at}.input_shapes must be lists of ints >= 0")
        secs = e.get("compile_seconds", 0.0)
        need(isinstance(secs, (int, float)) and not isinstance(secs, bool) and 0 <= secs < 1e9,
             f"{at}.compile_seconds must be a number of seconds")


def _check_tensor(t, where, axes, need, dynamic, version=FORMAT_VERSION, is_input=False):
    need(isinstance(t, dict), f"{where} must be an object")
    if dynamic:
        need(isinstance(t.get("name"), str), f"{where}.name must be a string")
    dt = t.get("dtype")
    need(isinstance(dt, str) and dt in DTYPE_NAMES, f"{where}.dtype {dt!r:.80} is not a known dtype")
    shape = t.get("shape")
    need(isinstance(shape, list) and all(_int(d) or (dynamic and isinstance(d, str) and d) for d in shape),
         f"{where}.shape {shape!r:.80} is malformed")
    js = t.get("jax_shape")
    need(js is None or (isinstance(js, list) and len(js) == len(shape)
                        and all(_int(d) or (isinstance(d, str) and d) for d in js)),
         f"{where}.jax_shape {js!r:.80} is malformed")
    sh = t.get("sharding")
    if sh is not None:
        need(isinstance(sh, list) and len(sh) == len(shape), f"{where}.sharding must have one entry per dim")
        for e in sh:
            names = [] if e is None else [e] if isinstance(e, str) else e
            need(isinstance(names, list) and all(isinstance(a, str) and a in axes for a in names),
                 f"{where}.sharding {sh!r:.80} names axes outside the mesh")
    for key, since in _INPUT_SINCE.items():
        if key in t:
            need(is_input, f"{where}.{key}: only a signature's inputs may have one")
            need(version >= since, f"{where}.{key} does not exist in format version {version}")
    if "index_bound" in t:
        need(_int(t["index_bound"], 1), f"{where}.index_bound {t['index_bound']!r:.80} must be an int > 0 "
             "(the rows of the embedding the ids index)")
