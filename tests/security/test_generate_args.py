"""`generate`'s arguments are checked by one function on all three runtimes (the LiteRT-LM engine on the
.litertlm, our loop on the .tflite, PJRT CPU on the TPU artifact): the same refusal, in one line, named as the
flag on the command line (--max-new-tokens) and as the argument in Python (max_new_tokens), before a token is
generated; the engine's own log lines stay hidden unless --verbose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("litert_lm")

from tests.security.lm_outputs import PROMPT, converted  # noqa: E402
from tpu_export.cli import main  # noqa: E402
from tpu_export.generate import GenerateArgumentError, Sampling  # noqa: E402
from tpu_export.generators import load_generator  # noqa: E402

RUNTIMES = ["android/model.litertlm", "android/model.tflite", "cpu-xla"]
VOCAB = 256
# case -> (CLI flags, Python call, the argument named, what its message says)
CASES = {
    "max_new_tokens_0": (["--max-new-tokens", "0"], dict(max_new_tokens=0), "max_new_tokens",
                         "must be an integer >= 1, got 0"),
    "max_new_tokens_-5": (["--max-new-tokens", "-5"], dict(max_new_tokens=-5), "max_new_tokens",
                          "must be an integer >= 1, got -5"),
    "temperature_nan": (["--temperature", "nan"], dict(sampling=dict(temperature=float("nan"))), "temperature",
                        "must be a finite number >= 0 (0: greedy), got nan"),
    "temperature_-1": (["--temperature", "-1"], dict(sampling=dict(temperature=-1.0)), "temperature",
                       "must be a finite number >= 0 (0: greedy), got -1.0"),
    "top_k_0": (["--top-k", "0"], dict(sampling=dict(top_k=0)), "top_k", "must be an integer >= 1, got 0"),
    "top_k_past_vocab": (["--top-k", str(VOCAB + 1), "--temperature", "1"],
                         dict(sampling=dict(top_k=VOCAB + 1, temperature=1.0)), "top_k",
                         f"{VOCAB + 1} is more than the model's {VOCAB}-token vocabulary"),
    "top_p_0": (["--top-p", "0"], dict(sampling=dict(top_p=0.0)), "top_p", "must be a number in (0, 1], got 0.0"),
    "top_p_1.5": (["--top-p", "1.5"], dict(sampling=dict(top_p=1.5)), "top_p", "must be a number in (0, 1], got 1.5"),
    "seed_2**70": (["--seed", str(2**70)], dict(sampling=dict(seed=2**70)), "seed",
                   f"must be an integer in [0, 2**63 - 1], got {2**70}"),
    "empty_prompt": (["--prompt", ""], dict(prompt=""), "prompt", "is empty"),
    "prompt_of_no_tokens": (["--prompt", "日本"], dict(prompt="日本"), "prompt", "tokenizes to no tokens"),
    # argv arrives with the undecodable byte as a surrogate escape (os.fsdecode(b"ab\xffc"))
    "invalid_utf8": (["--prompt", os.fsdecode(b"ab\xffc")], dict(prompt=os.fsdecode(b"ab\xffc")), "prompt",
                     "is not valid UTF-8 (the byte 0xff at character 2)"),
}


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return converted(tmp_path_factory)


def _python_call(gen, kw):
    kw = dict(kw)
    prompt, n = kw.pop("prompt", PROMPT), kw.pop("max_new_tokens", 4)
    sampling = Sampling(**kw["sampling"]) if "sampling" in kw else None
    return gen.generate(prompt, n, sampling=sampling)


@pytest.mark.engine
@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_argument_is_one_line_naming_it_the_same_on_every_runtime(out, capsys, case):
    flags, kw, arg, says = CASES[case]
    cli_lines, py_lines = [], []
    for rt in RUNTIMES:
        argv = ["generate", str(out / rt)] + ([] if "--prompt" in flags else ["--prompt", PROMPT]) + flags
        before = sorted(os.listdir(out / rt.split("/")[0]))
        assert main(argv) == 2, rt
        cap = capsys.readouterr()
        err = cap.err.strip()
        assert len(err.splitlines()) == 1 and cap.out == "", (rt, cap)
        flag = "--" + arg.replace("_", "-")
        assert err.startswith(f"tpu-export: error: {flag}: ") and says in err, (rt, err)
        cli_lines.append(err)
        # Python: the argument's own name; Sampling refuses what needs no model before any is loaded
        with pytest.raises(GenerateArgumentError) as e:
            _python_call(load_generator(out / rt), kw)
        assert e.value.arg == arg and str(e.value).startswith(f"{arg}: ") and says in str(e.value), (rt, e.value)
        py_lines.append(str(e.value))
        assert sorted(os.listdir(out / rt.split("/")[0])) == before  # nothing written
    assert len(set(cli_lines)) == 1 and len(set(py_lines)) == 1, (cli_lines, py_lines)  # identical everywhere


def test_sampling_refuses_out_of_range_values_before_any_model_is_loaded():
    for kw, arg in ((dict(temperature=float("inf")), "temperature"), (dict(top_k=True), "top_k"),
                    (dict(top_p=float("nan")), "top_p"), (dict(seed=-1), "seed"), (dict(seed=1.5), "seed")):
        with pytest.raises(GenerateArgumentError) as e:
            Sampling(**kw)
        assert e.value.arg == arg and e.value.for_cli().startswith(f"--{arg.replace('_', '-')}: ")


@pytest.mark.engine
def test_a_seed_at_the_top_of_its_range_samples_on_every_runtime(out):
    hot = Sampling(temperature=1.0, top_k=VOCAB, seed=2**63 - 1)
    for rt in RUNTIMES:
        res = load_generator(out / rt).generate(PROMPT, 4, sampling=hot)
        assert res.new_tokens == 4 and res.text, rt


@pytest.mark.engine
@pytest.mark.subprocess
def test_engine_log_lines_are_hidden_unless_verbose(out):
    """A clean run prints the reply and the timing line only; --verbose shows the engine's own lines (absl and
    LiteRT write them to fd 2 directly, past Python)."""
    argv = [sys.executable, "-m", "tpu_export.cli", "generate", str(out / "android/model.litertlm"), "--prompt",
            PROMPT, "--max-new-tokens", "4"]
    quiet = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert len(quiet.stderr.strip().splitlines()) == 1 and quiet.stderr.startswith("prefill: "), quiet.stderr
    loud = subprocess.run(argv + ["--verbose"], capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0 and loud.stdout == quiet.stdout
    assert len(loud.stderr.strip().splitlines()) > 5 and "INFO" in loud.stderr, loud.stderr


@pytest.mark.engine
@pytest.mark.subprocess
def test_an_engine_refusal_is_one_line_with_its_last_log_line(out, tmp_path):
    """A bundle the check passes but the engine refuses (no stop token: it cannot start a session) is one error
    line, not the engine's log."""
    from tests.security.lm_outputs import rebuilt_bundle

    bundle = rebuilt_bundle(out / "android/model.litertlm", tmp_path / "nostop.litertlm",
                            lambda llm: llm.ClearField("stop_tokens"))
    r = subprocess.run([sys.executable, "-m", "tpu_export.cli", "generate", str(bundle), "--prompt", PROMPT,
                        "--max-new-tokens", "4"],
                       capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"tpu-export: error: {bundle}: the LiteRT-LM engine cannot start a session"), lines
