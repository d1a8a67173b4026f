"""One call, both outputs: capture once, write a TPU artifact and a .tflite, both match torch."""

import json
import os

import numpy as np
import pytest
import torch

import tpu_export
from tpu_export import converter
from tpu_export.cli import main
from tpu_export.demo import max_rel_err
from tpu_export.demo_models import small_transformer


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(12, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x, scale):
        h = torch.nn.functional.gelu(self.fc1(x))
        return {"logits": self.fc2(h) * scale, "hidden": h}


def _args():
    g = torch.Generator().manual_seed(3)
    return torch.randn(2, 12, generator=g), torch.rand(1, generator=g) + 0.5


@pytest.mark.libtpu
def test_convert_writes_both_outputs_and_each_matches_torch(tmp_path):
    from tpu_export import litert_torch, tpu_backend

    m, args = Net().eval(), _args()
    written = tpu_export.convert(m, args, targets=["tpu-v6e", "android"], out_dir=tmp_path, topology="2x2")
    assert set(written) == {"tpu-v6e", "android"}
    want = m(*args)
    tpu_out = tpu_backend.load(written["tpu-v6e"])(*args)
    edge_out = litert_torch.load(written["android"])(*args)
    assert set(tpu_out) == {"logits", "hidden"} and set(edge_out) == {"logits", "hidden"}
    assert max_rel_err(tpu_out, want) <= 1e-5
    assert max_rel_err(edge_out, want) <= 1e-5
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["targets"]["tpu-v6e"]["aot"]["topology"] == "2x2"
    assert summary["targets"]["android"]["bytes"] == os.path.getsize(written["android"])
    rep = tpu_backend.read_artifact(written["tpu-v6e"]).reports()
    assert any("tpu-v6e" in k for k in rep)


def test_unsupported_op_fails_before_anything_is_written(tmp_path):
    class Bad(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()  # no lowering on either backend

    out = tmp_path / "out"
    with pytest.raises(converter.UnsupportedOpsError) as e:
        tpu_export.convert(Bad(), (torch.randn(8),), targets=["cpu-xla", "cpu"], out_dir=out)
    assert "_fft_r2c" in str(e.value) and "test_convert_both.py" in str(e.value)
    assert not out.exists()


def test_unknown_option_and_target_fail_before_capture(tmp_path):
    with pytest.raises(TypeError, match="unknown option"):
        tpu_export.convert(Net(), _args(), targets=["android"], out_dir=tmp_path / "a", bogus=1)
    with pytest.raises(ValueError, match="known targets"):
        tpu_export.convert(Net(), _args(), targets=["tpu-v99"], out_dir=tmp_path / "b")
    # a TPU option with only edge targets: no target of the call takes it (before: refused after capture)
    with pytest.raises(TypeError, match=r"unknown option\(s\) mesh: no target of this call \(android\)"):
        tpu_export.convert(Net(), _args(), targets=["android"], out_dir=tmp_path / "c", mesh={"data": 2})
    with pytest.raises(TypeError, match="option to_channel_last_io is gone; use channel_last_io"):
        tpu_export.convert(Net(), _args(), targets=["android"], out_dir=tmp_path / "d", to_channel_last_io=True)
    assert not [p for p in tmp_path.iterdir()]


def _image_model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(4 * 8 * 8, 5)).eval()
    g = torch.Generator().manual_seed(1)
    return m, (torch.randn(1, 3, 8, 8, generator=g),), [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)]


@pytest.mark.libtpu
def test_per_target_options_one_capture(tmp_path):
    """web (float), iot (needs calibration data, which web refuses) and tpu-v6e (a topology) from one call."""
    from tpu_export import tpu_backend
    from tpu_export.targets import TpuOptions

    m, args, cal = _image_model()
    lines = []
    written = tpu_export.convert(m, args, out_dir=tmp_path, progress=lines.append,
                                 targets={"web": {}, "iot": {"calibration_data": cal, "ram_kib": 512},
                                          "tpu-v6e": TpuOptions(topology="2x2")})
    assert sum(line.startswith("capture:") for line in lines) == 1
    assert sorted(os.listdir(tmp_path / "iot")) == ["iot.tflite", "iot_model.c", "iot_model.h"]
    assert sorted(os.listdir(tmp_path / "web")) == ["web.js", "web.tflite"]
    assert json.loads((tmp_path / "summary.json").read_text())["targets"]["tpu-v6e"]["aot"]["topology"] == "2x2"
    assert max_rel_err(tpu_backend.load(written["tpu-v6e"])(*args), m(*args)) <= 1e-5
    # shared options still reach every target of their kind; per-target ones add to them
    with pytest.raises(TypeError, match="'web' does not take option calibration_data without a static"):
        tpu_export.convert(m, args, targets=["web", "iot"], out_dir=tmp_path / "x", calibration_data=cal)
    with pytest.raises(TypeError, match="put the shared option.* topology"):
        tpu_export.convert(m, args, targets={"tpu-v6e": TpuOptions()}, out_dir=tmp_path / "x", topology="2x2")
    with pytest.raises(ValueError, match="named twice"):
        tpu_export.convert(m, args, targets=["web", "web"], out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.libtpu
def test_cli_per_target_options(tmp_path, capsys):
    m, args, cal = _image_model()
    pt2, npz = tmp_path / "m.pt2", tmp_path / "cal.npz"
    torch.export.save(torch.export.export(m, args), str(pt2))
    np.savez(npz, x=torch.cat([c[0] for c in cal]).numpy()[:, None])
    out = tmp_path / "out"
    assert main(["convert", str(pt2), "--target", "web", "--target", f"iot:calibration={npz},ram-kib=512",
                 "--target", "android:channel-last=off", "-o", str(out), "--quiet"]) == 0
    assert sorted(os.listdir(out)) == ["android", "iot", "summary.json", "web"]
    from tpu_export.targets.tflite_io import signatures

    (ins, _), = signatures((out / "android" / "android.tflite").read_bytes()).values()
    assert ins[0].shape == (1, 3, 8, 8)  # channel-last=off for android only
    capsys.readouterr()
    assert main(["convert", str(pt2), "--target", "iot:ram=1", "-o", str(tmp_path / "bad")]) == 2
    assert "unknown key 'ram'; keys: topology, use-pallas" in capsys.readouterr().err
    assert main(["convert", str(pt2), "--target", "iot:ram-kib=lots", "-o", str(tmp_path / "bad")]) == 2
    assert "ram-kib takes a number of KiB, got 'lots'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_cli_convert_inspect_run_round_trip(tmp_path, capsys):
    m, args = small_transformer()
    pt2 = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(m, args), str(pt2))
    out = tmp_path / "out"
    assert main(["convert", str(pt2), "--target", "cpu-xla", "--target", "cpu", "-o", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    tflite = out / "cpu" / "cpu.tflite"
    tpuexp = out / "cpu-xla" / "model.tpuexp"
    assert str(tflite) in printed and str(tpuexp) in printed
    assert main(["inspect", str(tflite)]) == 0
    text = capsys.readouterr().out
    assert "op histogram" in text and "FULLY_CONNECTED" in text and "input_ids" in text
    assert main(["inspect", str(tpuexp)]) == 0
    text = capsys.readouterr().out
    assert "stablehlo.dot_general" in text and "input_ids" in text
    ids = tmp_path / "ids.npy"
    np.save(ids, args[0].numpy())
    for art in (tflite, tpuexp):
        res = tmp_path / f"{art.name}.npz"
        assert main(["run", str(art), "--input", f"input_ids={ids}", "--save-outputs", str(res)]) == 0
        got = np.load(res)["output_0"]
        assert max_rel_err(torch.from_numpy(got), m(*args)) <= 1e-5


def test_cli_errors_are_one_line_with_nonzero_exit(tmp_path, capsys):
    rc = main(["inspect", str(tmp_path / "missing.tflite")])
    assert rc != 0
    err = capsys.readouterr().err
    assert err.startswith("tpu-export: error:") and "missing.tflite" in err and "Traceback" not in err
