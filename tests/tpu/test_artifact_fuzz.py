"""A seeded, bounded fuzz of the TPU artifact loader: mutated artifacts (directory and .zip) are
opened by ``read_artifact`` and ``tpu_backend.load(verify=True, use_compiled=True)`` and, when
accepted, called once, each in a child process with a timeout.

Must hold: no hang, no crash (child killed by a signal), no accepted artifact whose hash-covered
bytes were changed (a file listed in the manifest, or the manifest's own content), no error other
than an ArtifactError subclass from loading, and artifacts that are only laid out differently
(entries reordered, zip64 records, a re-indented manifest, a symlinked root) still load and
give torch's answer.

Not fuzzed here, on purpose: StableHLO bytecode changed *with* its hashes recomputed (a hostile
author). jaxlib's MLIR bytecode reader crashes (SIGSEGV/SIGABRT) or loops on some such inputs
(of 200 re-signed 1-3-bit flips of a 7 KB module: 6 crashes, 1 hang), at load or at the first
call alike; a sha256 check cannot help when the author signs the bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import queue
import random
import shutil
import struct
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tpu_export.tpu_backend.artifact import format as fmt

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261130
N_DIR, N_ZIP = 150, 90
PER_CHILD = 80  # cases per child process: amortises the jax import (~5 s)
CASE_TIMEOUT = 20.0  # seconds per case (a hang is far longer: forever)
START_TIMEOUT = 90.0


# ------------------------------------------------------------------ the base artifact


def _base(tmp: Path):
    import jax

    from tests.tpu.artifact_helpers import mlp_inputs, mlp_program
    from tpu_export import tpu_backend

    model, prog = mlp_program()
    bundle = tpu_backend.export_program(prog)
    # a CPU compile adds compiled/ files and a report to mutate (the runtime never loads them)
    tpu_backend.compile_on_devices(bundle, jax.devices(), target="cpu", topology="host", dim_values={"batch": 4})
    d = Path(bundle.save(tmp / "base.tpuexp"))
    z = Path(bundle.save(tmp / "base.tpuexp.zip"))
    args, kwargs = mlp_inputs(4, seed=7)
    out = model(*args, **kwargs)
    ref = {"x": args[0].tolist(), "offset": kwargs["offset"].tolist(),
          "logits": out["logits"].tolist(), "sum": out["stats"][0].tolist(), "top": out["stats"][1].tolist()}
    return d, z, ref


def _canon(raw: bytes):
    try:
        return json.dumps(json.loads(raw), sort_keys=True)
    except (ValueError, RecursionError):
        return None


# ------------------------------------------------------------------ manifest mutations

VALUES = [None, True, False, 0, -1, 1.5, 2**63, 10**30, float("nan"), "", "x" * 40, "../../etc/passwd", [], {},
          [1, "a", None], {"a": {"b": [1]}}, [[[[]]]], "tpu", "float32", "serving_default"]


def _paths(o, prefix=()):
    yield prefix
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _paths(v, prefix + (i,))


def _mutate_manifest(m: dict, rng: random.Random) -> tuple[dict, str | None, str]:
    """A changed copy of the manifest, or (copy, raw text) when the change cannot be JSON-dumped,
    and what was done."""
    m = json.loads(json.dumps(m))
    path = rng.choice([p for p in _paths(m) if p])
    parent = m
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    op = rng.choice(["value", "value", "value", "delete", "add", "deep", "huge"])
    done = f"{op} {'/'.join(map(str, path))}"
    if op == "delete":
        del parent[last]
        return m, None, done
    if op == "deep":
        depth = rng.choice([70, 400, 100_000])
        parent[last] = "@@DEEP@@"
        return m, json.dumps(m, indent=2).replace('"@@DEEP@@"', "[" * depth + "]" * depth), f"{done} {depth}"
    if op == "add" and isinstance(parent[last], dict):
        parent[last][rng.choice(["code", "__class__", "x"])] = rng.choice(VALUES)
    elif op == "huge":
        parent[last] = rng.choice([2**64 + 1, -(2**40), 10**300, 1e308])
    else:
        parent[last] = rng.choice(VALUES)
    return m, None, f"{done} = {json.dumps(parent[last])[:60]}"


# ------------------------------------------------------------------ directory cases


def _dir_case(base: Path, dst: Path, rng: random.Random) -> dict:
    shutil.copytree(base, dst)
    files = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
    m = json.loads((dst / "manifest.json").read_bytes())
    original = _canon((dst / "manifest.json").read_bytes())
    kind = rng.choice(["flip", "flip", "truncate", "append", "swap", "delete", "extra", "manifest", "manifest",
                       "signed_manifest", "signed_manifest", "signed_manifest", "special", "signed_file",
                       "layout"])
    rel = rng.choice(files)
    p = dst / rel
    case = {"kind": kind, "form": "dir", "covered": True, "must_pass": False}
    if kind == "flip":
        data = bytearray(p.read_bytes())
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        p.write_bytes(bytes(data))
        case["detail"] = f"{rel}@{i}"
    elif kind == "truncate":
        data = p.read_bytes()
        p.write_bytes(data[: rng.randrange(len(data))])
        case["detail"] = rel
    elif kind == "append":
        p.write_bytes(p.read_bytes() + bytes(rng.randrange(33, 127) for _ in range(rng.randint(1, 64))))
        case["detail"] = rel
    elif kind == "swap":
        other = dst / rng.choice([f for f in files if f != rel])
        a, b = p.read_bytes(), other.read_bytes()
        p.write_bytes(b)
        other.write_bytes(a)
        case["detail"] = f"{rel}<->{other.relative_to(dst)}"
    elif kind == "delete":
        p.unlink()
        case["detail"] = rel
    elif kind == "extra":
        extra = dst / rng.choice(["extra.bin", "signatures/evil.jaxexport", "compiled/x/y.bin", ".hidden"])
        extra.parent.mkdir(parents=True, exist_ok=True)
        extra.write_bytes(b"\0" * rng.randint(0, 100))
        case["detail"] = str(extra.relative_to(dst))
    elif kind in ("manifest", "signed_manifest"):
        new, raw, case["detail"] = _mutate_manifest(m, rng)
        if kind == "signed_manifest" and raw is None:
            new["manifest_sha256"] = fmt.manifest_digest(new)
        text = raw if raw is not None else json.dumps(new, indent=2)
        (dst / "manifest.json").write_text(text)
        # signed by a hostile author: nothing hash-covered changed without its hash; it may load
        case["covered"] = kind == "manifest" or raw is not None
        if _canon(text.encode()) == original:
            case["covered"] = False
    elif kind == "special":
        what = rng.choice(["fifo", "devzero", "link_inside", "link_outside", "dir_link"])
        if what == "dir_link":
            shutil.move(dst / "signatures", dst.parent / f"{dst.name}.sigs")
            (dst / "signatures").symlink_to(dst.parent / f"{dst.name}.sigs")
        else:
            p.unlink()
            if what == "fifo":
                os.mkfifo(p)
            else:
                target = {"devzero": "/dev/zero", "link_outside": str(base / rel),
                          "link_inside": str(dst / rng.choice([f for f in files if f != rel]))}[what]
                p.symlink_to(target)
        case["detail"] = f"{what} {rel}"
    elif kind == "signed_file":
        # a hostile author changes a file and re-signs it; never the StableHLO (see the docstring)
        rel = rng.choice([f for f in files if f != "manifest.json" and not f.endswith(".jaxexport")])
        p = dst / rel
        data = bytearray(p.read_bytes())
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        p.write_bytes(bytes(data))
        m["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        m["manifest_sha256"] = fmt.manifest_digest(m)
        (dst / "manifest.json").write_text(json.dumps(m, indent=2))
        case.update(covered=False, detail=rel)
    else:  # layout only: the same artifact, differently laid out -> must load
        what = rng.choice(["reindent", "root_link"])
        if what == "reindent":
            (dst / "manifest.json").write_text(json.dumps(m, indent=rng.choice([None, 1, 4]),
                                                          sort_keys=rng.random() < .5))
        else:
            real = dst.parent / f"{dst.name}.real"
            dst.rename(real)
            dst.symlink_to(real)
        case.update(covered=False, must_pass=True, detail=what)
    return case


# ------------------------------------------------------------------ zip cases


def _spans(raw: bytes) -> list[tuple[int, int]]:
    out = []
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        for i in zf.infolist():
            n, e = struct.unpack("<HH", raw[i.header_offset + 26:i.header_offset + 30])
            start = i.header_offset + 30 + n + e
            out.append((start, start + i.file_size))
    return out


def _rewrite(base: Path, dst: Path, rng: random.Random, how: str) -> None:
    with zipfile.ZipFile(base) as zin:
        entries = [(i.filename, zin.read(i)) for i in zin.infolist()]
    if how == "reorder":
        rng.shuffle(entries)
    target = rng.choice([n for n, _ in entries])
    with zipfile.ZipFile(dst, "w", allowZip64=True) as zout:
        for name, data in entries:
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED if how == "deflate" and name == target else zipfile.ZIP_STORED
            with zout.open(zi, "w", force_zip64=how == "zip64") as f:
                f.write(data)
            if how == "duplicate" and name == target:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    zout.writestr(zi, data[::-1])
        if how == "extra":
            zout.writestr(zipfile.ZipInfo("extra.bin", date_time=(1980, 1, 1, 0, 0, 0)), b"\0" * 10)


def _zip_case(base: Path, dst: Path, rng: random.Random) -> dict:
    raw = bytearray(base.read_bytes())
    spans = _spans(bytes(raw))
    kind = rng.choice(["flip", "flip", "flip", "truncate", "deflate", "duplicate", "extra", "cd_garbage",
                       "eocd_count", "prefix", "reorder", "zip64"])
    case = {"kind": kind, "form": "zip", "covered": True, "must_pass": False}
    if kind == "flip":
        i = rng.randrange(len(raw))
        raw[i] ^= 1 << rng.randrange(8)
        # inside a file's bytes it is covered by that file's sha256 (or is the manifest's content);
        # a flipped header field (timestamp, local CRC) may be harmless
        case["covered"] = any(a <= i < b for a, b in spans)
        case["detail"] = str(i)
        dst.write_bytes(bytes(raw))
    elif kind == "truncate":
        dst.write_bytes(bytes(raw[: rng.randrange(len(raw))]))
    elif kind in ("deflate", "duplicate", "extra"):
        _rewrite(base, dst, rng, kind)
    elif kind in ("reorder", "zip64"):
        _rewrite(base, dst, rng, kind)
        case.update(covered=False, must_pass=True)
    elif kind == "cd_garbage":
        cd = raw.find(b"PK\x01\x02")
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(cd, len(raw))] = rng.randrange(256)
        dst.write_bytes(bytes(raw))
        case["covered"] = False
    elif kind == "eocd_count":
        e = raw.rfind(b"PK\x05\x06")
        raw[e + 8:e + 12] = struct.pack("<HH", *(rng.choice([0, 1, 4, 6, 0xFFFF]),) * 2)
        dst.write_bytes(bytes(raw))
        case["covered"] = False
    else:  # prefix: bytes before the archive, as a self-extracting zip has
        dst.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) + bytes(raw))
        case["covered"] = False
    return case


# ------------------------------------------------------------------ the child


def _child(cases_file: str) -> None:
    """Open each case; one JSON line per case on stdout (START first, so a hang is attributable)."""
    from tpu_export.tpu_backend.aot import prepare_cpu_host

    prepare_cpu_host()
    from tpu_export import tpu_backend
    from tpu_export.tpu_backend.artifact.errors import ArtifactError

    spec = json.loads(Path(cases_file).read_text())
    ref = spec["ref"]
    x = np.asarray(ref["x"], np.float32)
    offset = np.asarray(ref["offset"], np.int64)
    for i, path in spec["cases"]:
        print(json.dumps({"start": i}), flush=True)
        res = {"i": i, "loaded": False, "error": None, "artifact_error": False, "call": None}
        try:
            tpu_backend.read_artifact(path, verify=True)
            prog = tpu_backend.load(path, verify=True, use_compiled=True)
            res["loaded"] = True
        except Exception as e:  # noqa: BLE001 - classified by the parent
            res.update(error=f"{type(e).__name__}: {e}"[:300], artifact_error=isinstance(e, ArtifactError))
        if res["loaded"]:
            try:
                out = prog(x, offset=offset)
                same = np.allclose(out["logits"].numpy(), ref["logits"], rtol=1e-5, atol=1e-5) and \
                    np.array_equal(out["stats"][1].numpy(), ref["top"])
                res["call"] = "same" if same else "different"
            except (ValueError, TypeError, IndexError) as e:  # input checks of a (signed) edited manifest
                res["call"] = f"refused: {type(e).__name__}: {e}"[:300]
            except Exception as e:  # noqa: BLE001 - anything else is a foreign error
                res["call"] = f"foreign: {type(e).__name__}: {e}"[:300]
        print(json.dumps(res), flush=True)


def _pump(stream, lines: queue.Queue) -> None:
    """Lines of a child's stdout into a queue (then None), so the parent can wait with a timeout."""
    for ln in stream:
        lines.put(ln)
    lines.put(None)


def _run_children(cases: list, ref: dict, work: Path) -> dict:
    """Every case through children; a hang or a crash is charged to the case that was running."""
    results, todo = {}, list(range(len(cases)))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    while todo:
        batch, todo = todo[:PER_CHILD], todo[PER_CHILD:]
        spec = work / f"batch{batch[0]}.json"
        spec.write_text(json.dumps({"ref": ref, "cases": [(i, cases[i]["path"]) for i in batch]}))
        code = f"from tests.tpu.test_artifact_fuzz import _child; _child({str(spec)!r})"
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        current, timeout = None, START_TIMEOUT
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                proc.kill()
                proc.wait()
                results[current if current is not None else batch[0]] = {"outcome": "hang"}
                break
            if line is None:
                rc = proc.wait()
                if current is not None and current not in results:
                    results[current] = {"outcome": "crash" if rc < 0 else f"exit {rc}"}
                elif current is None:
                    raise AssertionError(f"the fuzz child failed before its first case (exit {rc})")
                break
            msg = json.loads(line)
            if "start" in msg:
                current, timeout = msg["start"], CASE_TIMEOUT
            else:
                results[msg["i"]] = msg
        done = [i for i in batch if i in results]
        todo = [i for i in batch if i not in results and i > max(done)] + todo
    return results


def test_artifact_fuzz(tmp_path):
    base_dir, base_zip, ref = _base(tmp_path)
    rng = random.Random(SEED)
    cases = []
    for i in range(N_DIR + N_ZIP):
        dst = tmp_path / "cases" / (f"c{i}.tpuexp" if i < N_DIR else f"c{i}.tpuexp.zip")
        dst.parent.mkdir(exist_ok=True)
        case = _dir_case(base_dir, dst, rng) if i < N_DIR else _zip_case(base_zip, dst, rng)
        case["path"] = str(dst)
        cases.append(case)
    results = _run_children(cases, ref, tmp_path)

    bad = {"hang": [], "crash": [], "accepted corruption": [], "foreign error": [], "refused valid": []}
    loaded = 0
    for i, case in enumerate(cases):
        r = results[i]
        what = f"case {i} {case['form']}/{case['kind']} {case.get('detail', '')}: {r}"
        if r.get("outcome") in ("hang", "crash"):
            bad[r["outcome"]].append(what)
            continue
        if r.get("outcome"):
            bad["crash"].append(what)
            continue
        loaded += r["loaded"]
        if r["error"] and not r["artifact_error"]:
            bad["foreign error"].append(what)
        if r["loaded"] and case["covered"]:
            bad["accepted corruption"].append(what)
        if r["call"] and r["call"].startswith("foreign"):
            bad["foreign error"].append(what)
        if case["must_pass"] and r["call"] != "same":
            bad["refused valid"].append(what)
    n = len(cases)
    print(f"artifact fuzz: {n} mutated artifacts ({N_DIR} directory, {N_ZIP} zip), {n - loaded} refused, "
          f"{loaded} loaded; {len(bad['hang'])} hangs, {len(bad['crash'])} crashes, "
          f"{len(bad['accepted corruption'])} accepted corruptions, {len(bad['foreign error'])} foreign errors")
    assert not any(bad.values()), json.dumps({k: v[:5] for k, v in bad.items() if v}, indent=1)
    # the fuzz reaches past the first checks: some cases load, most kinds are refused
    assert 0 < loaded < n
