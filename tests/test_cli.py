"""The tpu-export command: help, targets, and one-line errors with non-zero exit codes."""

import os
import subprocess
import sys

import pytest

from tpu_export.cli import main


def test_help_lists_commands_and_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("convert", "run", "inspect", "demo", "targets", "ops"):
        assert cmd in out
    assert "examples:" in out and "--target tpu-v6e" in out


def test_targets_lists_every_target(capsys):
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for t in ("tpu-v5e", "tpu-v6e", "tpu-v5p", "tpu-v7x", "android", "ios", "web", "iot", "cpu", "cuda", "cpu-xla"):
        assert t in out


def test_unknown_target_is_a_one_line_error(capsys, tmp_path):
    rc = main(["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v9", "-o", str(tmp_path / "o"),
               "--quiet"])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("tpu-export: error: --target tpu-v9: unknown target 'tpu-v9'; targets: ") and "tpu-v6e" in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_bad_model_spec(capsys, tmp_path):
    rc = main(["convert", "no_such_module_xyz:f", "--target", "android", "-o", str(tmp_path / "o")])
    assert rc == 2
    assert "cannot load 'no_such_module_xyz:f'" in capsys.readouterr().err


@pytest.mark.subprocess
def test_console_script_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "tpu_export.cli", "targets"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "tpu-v7x" in r.stdout


@pytest.mark.subprocess
def test_console_script_skips_the_exit_collections_and_callers_keep_theirs():
    # The console script (main() with no argv) freezes what the command made so that the interpreter's shutdown
    # does not collect it; main([...]) from a caller's own process leaves its collector alone.
    code = (
        "import gc, sys; from tpu_export.cli import main; sys.argv = ['tpu-export', 'targets']; "
        "c1 = main(['targets']); f1 = gc.get_freeze_count(); c2 = main(); "
        "print('FREEZE', c1, f1, c2, gc.get_freeze_count() > 0, file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "FREEZE 0 0 0 True" in r.stderr


def _compile_cache(out):
    import json

    (report,) = list(out.glob("tpu-v6e/model.tpuexp/compiled/*/report.json"))
    return json.loads(report.read_text())["signatures"]["serving_default"]["compile_cache"]


@pytest.mark.libtpu
def test_cache_dir_makes_a_second_conversion_a_hit(tmp_path, monkeypatch):
    """--cache-dir DIR is the AOT compile cache: the second conversion of the same model reuses the first's
    executable (report.json says hit), and the variable it sets does not outlive the command."""
    monkeypatch.delenv("TPU_EXPORT_AOT_CACHE", raising=False)
    argv = ["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v6e", "--topology", "1x1",
            "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    assert main(argv + ["-o", str(tmp_path / "a")]) == 0
    assert _compile_cache(tmp_path / "a") == "miss" and any((tmp_path / "cache").rglob("*.exe"))
    assert main(argv + ["-o", str(tmp_path / "b")]) == 0
    assert _compile_cache(tmp_path / "b") == "hit"
    assert "TPU_EXPORT_AOT_CACHE" not in os.environ


def test_cache_dir_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("")
    rc = main(["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v6e", "--cache-dir", str(f),
               "-o", str(tmp_path / "o"), "--quiet"])
    assert rc == 2 and "--cache-dir" in capsys.readouterr().err and not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny Linear + ReLU + softmax converted by the CLI for cpu (.tflite) and cpu-xla (a TPU artifact)."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.relu(self.fc(x)).softmax(-1)

    tmp = tmp_path_factory.mktemp("inspect")
    m = Tiny().eval()
    pt2 = tmp / "tiny.pt2"
    torch.export.save(torch.export.export(m, (torch.randn(2, 4),)), str(pt2))
    out = tmp / "out"
    assert main(["convert", str(pt2), "--target", "cpu", "--target", "cpu-xla", "-o", str(out), "--quiet"]) == 0
    return out


def _inspect(capsys, *argv) -> str:
    assert main(["inspect", *map(str, argv)]) == 0
    return capsys.readouterr().out


def test_inspect_a_tflite_prints_a_summary_and_json_the_same_signatures(converted, capsys):
    import json
    import re

    path = converted / "cpu" / "cpu.tflite"
    text = _inspect(capsys, path)
    size = os.path.getsize(path)
    assert text.startswith(f"{path}: LiteRT flatbuffer, {size:,} bytes")
    assert re.search(r"^  signature 'serving_default'$", text, re.M)
    assert re.search(r"^    input  x\s+\[2, 4\] float32$", text, re.M)
    assert re.search(r"^    output \S+\s+\[2, 3\] float32$", text, re.M)
    assert re.search(r"^    FULLY_CONNECTED\s+1$", text, re.M) and re.search(r"^    SOFTMAX\s+1$", text, re.M)
    data = json.loads(_inspect(capsys, path, "--json"))
    assert data["kind"] == "tflite" and data["bytes"] == size
    assert data["op_histogram"]["FULLY_CONNECTED"] == 1 and data["op_histogram"]["SOFTMAX"] == 1
    (sig,) = data["signatures"].values()
    assert list(data["signatures"]) == ["serving_default"]
    assert [(s["name"], s["shape"], s["dtype"]) for s in sig["inputs"]] == [("x", [2, 4], "float32")]
    for s in sig["outputs"]:  # the summary shows each output as the JSON has it
        line = rf"^    output {re.escape(s['name'])}\s+{re.escape(str(s['shape']))} {s['dtype']}$"
        assert re.search(line, text, re.M)
    assert _inspect(capsys, converted / "cpu") == text  # a target folder: the model file in it


def test_inspect_a_tpu_artifact_prints_weights_platforms_and_ops(converted, capsys):
    import json

    path = converted / "cpu-xla" / "model.tpuexp"
    text = _inspect(capsys, path)
    assert "TPU artifact format" in text and "weights: 2 tensors, 60 bytes" in text and "platforms: cpu" in text
    assert "input  x" in text and "stablehlo.dot_general" in text
    assert "compiled: none" in text  # cpu-xla: no AOT executables
    data = json.loads(_inspect(capsys, converted / "cpu-xla", "--json"))
    assert data["kind"] == "tpu-artifact" and data["weights"] == {"count": 2, "bytes": 60}
    assert data["platforms"] == ["cpu"] and data["compiled"] == {}
    assert data["signatures"]["serving_default"]["inputs"] == [{"name": "x", "shape": [2, 4], "dtype": "float32"}]
    assert data["signatures"]["serving_default"]["stablehlo_ops"]["stablehlo.dot_general"] >= 1


def test_inspect_the_whole_output_folder_names_its_targets(converted, capsys):
    assert main(["inspect", str(converted)]) == 1
    err = capsys.readouterr().err
    assert "inspect one target in it" in err and str(converted / "cpu") in err


def test_compiled_report_figures_xla_does_not_know_read_unknown():
    """A compiled target's figures in the summary: XLA's "don't know" (None with a reason, or a raw negative
    number in an older report) reads `unknown`, never a number."""
    from tpu_export.targets.describe import _fmt_compiled

    rep = {"device_kind": "TPU v6 lite", "chips_used": 1, "devices_used": 1, "signatures": {"serving_default": {
        "compile_seconds": 1.25, "compile_cache": "miss", "executable_bytes": 4096,
        "cost": {"flops": {"per_device": None, "whole_program": None, "per_chip": None, "unknown": "why"},
                 "transcendentals": {"per_device": 3.0, "per_chip": 3.0, "whole_program": 3.0},
                 "bytes_accessed": {"per_device": 2048.0, "per_chip": 2048.0, "whole_program": 2048.0},
                 "optimal_seconds": {"value": -2.99, "scope": "whole_program"}},
        "memory": {"argument_bytes": {"per_device": 1024}, "temp_bytes": {"per_device": 0}},
        "hbm": {"needed_bytes_per_device": 1024, "available_bytes_per_device": 1 << 30},
        "roofline": {"xla_bytes": {"value": None, "unknown": "XLA's FLOPs are unknown"}}}},
        "llm": {"decode": {"lower_bound_bytes_per_token": 10.0, "xla": {"tokens_per_s_per_chip": {
            "value": None, "unknown": "no"}, "what": "prose"}}}}
    text = "\n".join(_fmt_compiled("tpu-v6e-1x1", rep))
    assert "compiled in 1.25 s, cache miss, executable 4.0 KiB" in text
    assert "flops unknown, transcendentals 3, bytes accessed 2.0 KiB" in text
    assert "peak memory 1.0 KiB per device of 1.0 GiB HBM" in text
    assert "XLA estimate unknown, roofline unknown" in text
    assert '"tokens_per_s_per_chip": "unknown"' in text and '"lower_bound_bytes_per_token": 10.0' in text
    assert "-2.99" not in text and "None" not in text and "null" not in text and "prose" not in text


def test_an_nhwc_boundary_is_said_with_the_cli_key_that_turns_it_off(tmp_path, capsys):
    """android lays image tensors out NHWC, cpu keeps torch's NCHW: the progress says so where it applies, in the
    CLI's words, and the files have those shapes."""
    from ai_edge_litert.interpreter import Interpreter

    out = tmp_path / "o"
    assert main(["convert", "tpu_export.demo_models:small_cnn", "--target", "android", "--target", "cpu",
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err
    said = [ln for ln in err.splitlines() if "NHWC" in ln]
    assert len(said) == 1 and "android: input " in said[0], err
    assert said[0].endswith("(this target's default; --target android:channel-last=off keeps torch's NCHW)")
    shapes = {t: list(Interpreter(str(out / t / f"{t}.tflite")).get_input_details()[0]["shape"])
              for t in ("android", "cpu")}
    assert shapes["android"][-1] == shapes["cpu"][1] and shapes["android"][1:3] == shapes["cpu"][2:], shapes
