"""A .pt2 never unpickles, evaluates or runs anything from the file (converter/pt2_load.py).

Each hostile file is a real torch.export.save archive with one part rewritten, and its payload
would create a marker file. Where torch.export.load itself runs the payload, the test shows it
does (so the file is a live exploit, not a file nothing would have run), then that our loader
and the CLI never do.
"""

from __future__ import annotations

import json
import pickle
import random
import zipfile

import pytest
import torch
from torch import nn

from tpu_export import litert_torch
from tpu_export.cli import main
from tpu_export.converter.errors import ExportFailedError
from tpu_export.converter.pipeline import prepare, run_program


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("shift", torch.arange(3.0))

    def forward(self, x):
        y = self.fc(x) + self.shift
        return torch.cat([y, y.flip(0) * 2]).softmax(-1)  # a size expression: Mul(2, s)


class _Marker:
    """Unpickling (or evaluating) this creates ``path``: the proof that code from the file ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _saved(tmp_path):
    torch.manual_seed(0)
    m = _Net().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(m, (torch.randn(4, 4),), dynamic_shapes=({0: batch},))
    path = tmp_path / "clean.pt2"
    torch.export.save(ep, str(path))
    return m, path


def _rewrite(src, dst, edits: dict):
    """Copy the archive, replacing each entry whose name ends with a key by edits[key](bytes)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            for suffix, fn in edits.items():
                if info.filename.endswith(suffix):
                    data = fn(data)
            zout.writestr(info.filename, data)
    return dst


def _cli_error(path, tmp_path, capsys) -> str:
    rc = main(["convert", str(path), "--target", "android", "-o", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and not (tmp_path / "out").exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpu-export: error: "), err
    return lines[0]


def test_pickled_weight_is_refused_and_never_unpickled(tmp_path, capsys):
    _, clean = _saved(tmp_path)
    marker = tmp_path / "pickle_ran"

    def use_pickle(b):
        cfg = json.loads(b)
        cfg["config"]["fc.weight"]["use_pickle"] = True
        return json.dumps(cfg).encode()

    with zipfile.ZipFile(clean) as z:
        entry = json.loads(z.read("clean/data/weights/model_weights_config.json"))["config"]["fc.weight"]["path_name"]
    path = _rewrite(clean, tmp_path / "pickled.pt2", {
        "model_weights_config.json": use_pickle,
        f"data/weights/{entry}": lambda b: pickle.dumps(_Marker(marker)),  # what torch.load(weights_only=False) reads
    })
    line = _cli_error(path, tmp_path, capsys)
    assert str(path) in line and "refusing to load" in line and "use_pickle" in line and "Fix:" in line
    with pytest.raises(ExportFailedError, match="pickle"):
        prepare(str(path))
    assert not marker.exists()
    with pytest.raises(Exception):  # noqa: B017 - torch's own loader unpickles the payload, then fails
        torch.export.load(str(path))
    assert marker.exists()


def test_sample_inputs_pickle_is_never_read(tmp_path):
    """torch.export.load unpickles data/sample_inputs with weights_only=False when weights_only
    fails: a payload there runs from an archive whose weights are all raw tensors."""
    m, clean = _saved(tmp_path)
    marker = tmp_path / "sample_inputs_ran"
    path = _rewrite(clean, tmp_path / "inputs.pt2",
                    {"data/sample_inputs/model.pt": lambda b: pickle.dumps(_Marker(marker))})
    x = torch.randn(6, 4)
    prog = prepare(str(path))  # accepted: nothing hostile is read
    torch.testing.assert_close(run_program(prog, x), m(x))
    assert not marker.exists()
    with pytest.raises(Exception):  # noqa: B017 - torch unpickles the payload, then fails on what it returned
        torch.export.load(str(path))
    assert marker.exists()


def test_shape_expression_is_never_evaluated(tmp_path, capsys):
    """torch.export.load passes every expr_str to sympy.sympify, which runs it as Python."""
    _, clean = _saved(tmp_path)
    marker = tmp_path / "sympify_ran"

    def inject(b):
        j = json.loads(b)
        x = j["graph_module"]["graph"]["tensor_values"]["x"]
        x["sizes"][0]["as_expr"]["expr_str"] = f"__import__('builtins').open({str(marker)!r}, 'w') and s77"
        return json.dumps(j).encode()

    path = _rewrite(clean, tmp_path / "expr.pt2", {"models/model.json": inject})
    line = _cli_error(path, tmp_path, capsys)
    assert "shape expression" in line and "__import__" in line
    assert not marker.exists()
    torch.export.load(str(path))  # loads without a complaint: the expression evaluated to s77
    assert marker.exists()


def _custom_object(b):
    cfg = json.loads(b)
    for meta in cfg["config"].values():
        meta["path_name"] = meta["path_name"].replace("tensor_", "custom_obj_")
    return json.dumps(cfg).encode()


def _retarget(b):
    j = json.loads(b)
    j["graph_module"]["graph"]["nodes"][0]["target"] = "torch.os.system"
    return json.dumps(j).encode()


@pytest.mark.parametrize("edit, expect", [
    ({"data/constants/model_constants_config.json": _custom_object}, "pickled custom object"),
    ({"models/model.json": _retarget}, "'torch.os.system', which is not a torch operator"),
    ({"archive_version": lambda b: b"7"}, "archive version"),
    ({"models/model.json": lambda b: b[: len(b) // 2]}, "not a readable torch.export .pt2"),
])
def test_other_hostile_or_corrupt_archives_are_one_line_errors(tmp_path, edit, expect):
    _, clean = _saved(tmp_path)
    if "data/constants/model_constants_config.json" in edit:  # give the model a constant to corrupt
        ep = torch.export.export(_WithConstant(), (torch.randn(2, 3),))
        torch.export.save(ep, str(clean))
    path = _rewrite(clean, tmp_path / "bad.pt2", edit)
    with pytest.raises(ExportFailedError) as e:
        prepare(str(path))
    assert expect in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


class _WithConstant(nn.Module):
    def forward(self, x):
        return x + torch.tensor([1.0, 2.0, 3.0])


def test_archives_torch_save_and_aotinductor_are_refused(tmp_path):
    pkl = tmp_path / "state.pt2"
    torch.save({"w": torch.ones(2)}, str(pkl))  # a torch.save zip named .pt2: data.pkl inside
    with pytest.raises(ExportFailedError, match=r"holds a pickle \(.*data.pkl\)"):
        prepare(str(pkl))
    _, clean = _saved(tmp_path)
    aoti = tmp_path / "aoti.pt2"
    _rewrite(clean, aoti, {})
    with zipfile.ZipFile(aoti, "a") as z:
        z.writestr("clean/data/aotinductor/model/model.so", b"\x7fELF")
    with pytest.raises(ExportFailedError, match="AOTInductor compiled code"):
        prepare(str(aoti))


def test_clean_dynamic_pt2_converts_and_runs_at_other_batches(tmp_path, capsys):
    m, clean = _saved(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", str(clean), "--target", "android", "-o", str(out), "--quiet"]) == 0
    tflite = next(out.rglob("*.tflite"))
    model = litert_torch.load(tflite)
    for n in (2, 7):
        x = torch.randn(n, 4)
        torch.testing.assert_close(model(x), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_corrupted_archives_never_escape_as_other_exceptions(tmp_path):
    """Bounded, seeded: bit flips, truncations and overwritten runs of a real archive either load
    or raise the one-line ExportFailedError."""
    _, clean = _saved(tmp_path)
    data = clean.read_bytes()
    rng = random.Random(7)
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(120):
        b = bytearray(data)
        kind = i % 3
        if kind == 0:
            for _ in range(rng.randint(1, 6)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            b = b[: rng.randrange(len(b))]
        else:
            p = rng.randrange(len(b))
            patch = rng.choice([b"\xff" * 8, b"\x00" * 8, bytes(rng.randrange(256) for _ in range(8))])
            b[p: p + 8] = patch[: len(b[p: p + 8])]
        path = tmp_path / f"m{i}.pt2"
        path.write_bytes(bytes(b))
        try:
            prepare(str(path))
            outcomes["loaded"] += 1
        except ExportFailedError as e:
            assert "\n" not in str(e) and str(path) in str(e), str(e)
            outcomes["refused"] += 1
        except Exception as e:  # noqa: BLE001 - re-checked below: any error but a ConversionError fails, naming the file
            from tpu_export.converter.errors import ConversionError

            # a converter error on a graph the flip left valid is fine, any other is not
            assert isinstance(e, ConversionError), (path, type(e), e)
    assert outcomes["refused"] > 60, outcomes


@pytest.mark.subprocess
def test_a_fifo_given_as_the_pt2_is_refused_at_once(tmp_path):
    """A FIFO never answers: opened non-blocking and refused, in a child so a regression fails, not hangs."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "model.pt2"
    os.mkfifo(fifo)
    code = ("from tpu_export.converter.pt2_load import load_pt2\n"
            "try:\n    load_pt2(%r)\nexcept Exception as e:\n    print(type(e).__name__, e)\n" % str(fifo))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("ExportFailedError "), r.stdout + r.stderr
    assert "the .pt2 archive is a FIFO, not a regular file" in r.stdout
