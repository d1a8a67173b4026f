"""ExportedBundle -> artifact on disk (a directory, or one .zip file), written atomically."""

from __future__ import annotations

import json
import os
import re
import zipfile
from typing import TYPE_CHECKING

from . import format as fmt
from .dtypes import torch_to_name
from .errors import ArtifactError
from .safetensors_io import write_safetensors
from .versions import runtime_versions
from .writer import StagingDir, publish_dir, publish_zip

if TYPE_CHECKING:
    from ..export import ExportedBundle

__all__ = ["save", "is_single_file_path"]


def is_single_file_path(path) -> bool:
    return os.fspath(path).lower().endswith(".zip")


def _file_stem(name: str, taken: set) -> str:
    stem = re.sub(r"[^\w.\-]", "_", name).lstrip(".") or "signature"
    base, i = stem, 1
    while stem in taken:
        i += 1
        stem = f"{base}_{i}"
    taken.add(stem)
    return stem


def _check_replaceable(path: str, single: bool) -> None:
    """Only an artifact (or an empty directory) is ever replaced: saving over an unrelated
    directory or file must not delete it."""
    if not os.path.lexists(path):
        return
    if not single and os.path.isdir(path) and not os.path.islink(path):
        if not os.listdir(path) or os.path.isfile(os.path.join(path, "manifest.json")):
            return
    if single and os.path.isfile(path) and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            if "manifest.json" in zf.namelist():
                return
    raise ArtifactError(f"refusing to replace {path}: it exists and is not a tpu-export artifact "
                        "(no manifest.json). Choose another path or remove it first.")


def save(bundle: ExportedBundle, path: str | os.PathLike[str], *, single_file: bool | None = None) -> str:
    """Write an exported bundle to disk as a TPU artifact (``bundle.save(path)`` calls this).

    The artifact is a directory (``manifest.json``, ``weights.safetensors``, one ``.jaxexport`` per signature
    and the TPU executables ``compile_for`` added), or the same files in one uncompressed ``.zip``. It is
    written into a staging folder beside ``path`` and renamed into place: a failed save leaves ``path`` as it
    was. Only an earlier artifact (or an empty directory) is ever replaced.

    Args:
        bundle: What ``tpu_backend.export_program`` returned.
        path: Where to write it.
        single_file: True: one ``.zip`` file; False: a directory; None (default): a ``.zip`` when ``path`` ends
            in ``.zip``, else a directory.

    Returns:
        The path written.

    Raises:
        tpu_export.tpu_backend.ArtifactError: ``path`` exists and is not an artifact (no ``manifest.json``), or
            cannot be written.

    Examples:
        >>> import os, tempfile
        >>> import torch
        >>> from tpu_export import converter, tpu_backend
        >>> bundle = tpu_backend.export_program(converter.prepare(torch.nn.Linear(4, 2).eval(), (torch.ones(1, 4),)))
        >>> folder = tempfile.mkdtemp()
        >>> path = bundle.save(os.path.join(folder, "m.tpuexp"))
        >>> sorted(os.listdir(path))
        ['manifest.json', 'signatures', 'weights.safetensors']
        >>> zipped = bundle.save(os.path.join(folder, "m.tpuexp.zip"))   # the same artifact in one file
        >>> tpu_backend.load(zipped)(torch.ones(1, 4)).shape
        torch.Size([1, 2])
    """
    path = os.fspath(path)
    single = is_single_file_path(path) if single_file is None else single_file
    _check_replaceable(path, single)
    stage = StagingDir(path)
    try:
        weights_meta = {}
        with stage.open("weights.safetensors") as f:
            write_safetensors(f, bundle.weights, {"format": "pt", "program_fingerprint": bundle.fingerprint})
        for name, t in bundle.weights.items():
            entry = {"shape": list(t.shape), "dtype": torch_to_name(t.dtype)}
            if bundle.mesh is not None:
                entry["sharding"] = bundle.weight_shardings[name]
            weights_meta[name] = entry

        sigs, taken = {}, set()
        for name, s in bundle.signatures.items():
            rel = f"signatures/{_file_stem(name, taken)}.jaxexport"
            stage.write(rel, s.serialize())
            sigs[name] = {
                "file": rel, "weight_names": s.weight_names,
                "inputs": [t.to_json() for t in s.inputs], "outputs": [t.to_json() for t in s.outputs],
                "input_structure": s.input_structure, "output_structure": s.output_structure,
                "dim_ranges": s.dim_ranges,
            }

        compiled, ctaken = [], set()
        for c in bundle.compiled:
            d = f"compiled/{_file_stem(c.key, ctaken)}"
            entry_sigs, stems = {}, set()
            for sname, cs in c.signatures.items():
                rel = f"{d}/{_file_stem(sname, stems)}.bin"
                stage.write(rel, cs.executable)
                entry_sigs[sname] = {"file": rel, "input_shapes": cs.input_shapes,
                                     "compile_seconds": round(cs.compile_seconds, 4)}
            stage.write(f"{d}/report.json", json.dumps(c.report, indent=2, sort_keys=True).encode())
            compiled.append({
                "target": c.target, "topology": c.topology, "platform": c.platform, "device_kind": c.device_kind,
                "num_devices": c.num_devices, "versions": c.versions, "signatures": entry_sigs,
                "report": f"{d}/report.json",
            })

        manifest = {
            "format": fmt.FORMAT_NAME,
            "format_version": fmt.FORMAT_VERSION,
            "created_by": runtime_versions(),
            "program_fingerprint": bundle.fingerprint,
            "platforms": list(bundle.platforms),
            "dtype": bundle.dtype,
            "enable_x64": bool(bundle.enable_x64),
            "mesh": bundle.mesh.to_json() if bundle.mesh is not None else None,
            "partition_rules": bundle.rules.to_json() if bundle.rules is not None else None,
            "weights": {"file": "weights.safetensors", "tensors": weights_meta},
            "signatures": sigs,
            "compiled": compiled,
            "quant": ({"scheme": bundle.quant,
                       "weights": {n: {"int8": q, "scale": sc} for n, (q, sc) in sorted(bundle.quant_parts.items())}}
                      if bundle.quant else None),
            "files": dict(sorted(stage.files.items())),
        }
        manifest["manifest_sha256"] = fmt.manifest_digest(manifest)
        fmt.validate_manifest(manifest)  # never write what the loader would refuse
        stage.write("manifest.json", json.dumps(manifest, indent=2).encode())
        if single:
            # manifest first: a reader finds it at the front of the file.
            order = ["manifest.json"] + sorted(stage.files.keys() - {"manifest.json"})
            publish_zip(stage, path, order)
            stage.cleanup()
        else:
            publish_dir(stage, path)
    except BaseException:
        stage.cleanup()
        raise
    return path
