"""convert-lm's check of what it wrote (targets/lm_verify.py): the tiny Llama's artifacts for android and tpu-v6e
(aot off: StableHLO run on PJRT CPU) match transformers' forward to 1e-4; a conversion broken after the capture
(one weight of the captured Program negated, so every artifact computes another model) is refused with one
line and out_dir is left as it was; verify=False / --no-verify publishes it and summary.json says "off"."""

from __future__ import annotations

import json
import os

import pytest

transformers = pytest.importorskip("transformers")

from tests.llm_models import save_model_dir, tiny_model, tiny_tokenizer  # noqa: E402
from tpu_export.cli import main  # noqa: E402
from tpu_export.targets import lm as lm_mod  # noqa: E402
from tpu_export.targets.lm import convert_lm  # noqa: E402
from tpu_export.targets.lm_source import LmSourceError  # noqa: E402

pytestmark = [pytest.mark.slow]

TARGETS = {"android": {}, "tpu-v6e": {"aot": False}}
KW = dict(prefill_lengths=(8,), cache_len=64)
BROKEN = "layers.1.self_attn.v_proj.weight"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir("llama", tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def good(model_dir, tmp_path_factory):
    out, said = tmp_path_factory.mktemp("lm") / "out", []
    convert_lm(str(model_dir), TARGETS, out, progress=said.append, **KW)
    return out, said


@pytest.fixture
def broken_capture(monkeypatch):
    """The real capture, then one weight of the captured Program replaced by its negation (a new tensor: the
    source model the reference runs keeps its own)."""
    real = lm_mod.capture_lm

    def capture(*a, **k):
        prog, spec = real(*a, **k)
        name = next(n for n in prog.weights if n.endswith(BROKEN))
        prog.weights[name] = -prog.weights[name]
        return prog, spec

    monkeypatch.setattr(lm_mod, "capture_lm", capture)


def _snapshot(folder):
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(folder) for f in files}


def test_each_target_is_checked_against_transformers(good):
    out, said = good
    s = json.loads((out / "summary.json").read_text())
    for t in TARGETS:
        v = s["targets"][t]["verify"]
        assert v["signature"] == "prefill_8+decode" and v["tokens"] == 9 and v["bound"] == 1e-4
        assert v["rel_err"] <= 1e-4 and v["scheme"] == "float32" and v["reference"] == "transformers"
        assert s["targets"][t]["stages"]["verify"] < 30
    assert "verify" in s["stages"]
    assert "verify: prefill logits against transformers" in said
    assert "android: verify: prefill logits against transformers" in said


def test_a_broken_conversion_is_refused_and_out_dir_untouched(good, model_dir, broken_capture):
    out, _ = good
    before = _snapshot(out)
    with pytest.raises(LmSourceError) as e:
        convert_lm(str(model_dir), TARGETS, out, **KW)
    msg = str(e.value)
    assert "\n" not in msg
    assert "'android'" in msg and "prefill_8+decode" in msg and "> bound 0.0001" in msg
    assert "--no-verify" in msg and "verify=False" in msg
    rel = float(msg.split("rel err ")[1].split()[0])
    assert rel > 1e-2
    assert _snapshot(out) == before
    assert not [p for p in os.listdir(out.parent) if p.startswith(".out")]  # no staging folder left


def test_no_verify_publishes_the_broken_one(model_dir, tmp_path, broken_capture):
    out = tmp_path / "out"
    convert_lm(str(model_dir), TARGETS, out, verify=False, **KW)
    s = json.loads((out / "summary.json").read_text())
    assert {t: s["targets"][t]["verify"] for t in TARGETS} == {"android": "off", "tpu-v6e": "off"}
    assert "verify" not in s["stages"]


def test_cli_error_is_one_line_and_no_verify_publishes(model_dir, tmp_path, broken_capture, capsys):
    out = tmp_path / "out"
    args = ["convert-lm", str(model_dir), "--target", "android", "--target", "tpu-v6e:aot=off", "--prefill", "8",
            "--cache", "64", "-o", str(out), "--quiet"]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "verify: target 'android' signature prefill_8+decode" in err and "--no-verify" in err
    assert not out.exists()
    assert main(args + ["--no-verify"]) == 0
    assert json.loads((out / "summary.json").read_text())["targets"]["android"]["verify"] == "off"


def test_a_cache_protocol_module_is_checked_against_its_own_forward(tmp_path):
    from tpu_export.converter.llm import KVCacheLM

    module = KVCacheLM(tiny_model("llama"), 64).eval()
    convert_lm(module, {"android": {}}, tmp_path / "out", tokenizer=tiny_tokenizer(), prefill_lengths=(8,))
    v = json.loads((tmp_path / "out" / "summary.json").read_text())["targets"]["android"]["verify"]
    assert v["reference"] == "the module's eager forward" and v["rel_err"] <= 1e-4
