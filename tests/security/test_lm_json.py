"""lm.json (beside a .tflite LLM and in a TPU artifact's folder) is read by the untrusted-file rule and checked
field by field before anything is sized from it: its caches must be the model file's own decode inputs, so
`cache_len: 10**7` is refused in one line naming lm.json, at once and without allocating the 5 GB it asks for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.security.lm_outputs import PROMPT, copy_target  # noqa: E402
from tpu_export.generators import GeneratorError, load_generator  # noqa: E402

TARGETS = [("android", "model.tflite"), ("cpu-xla", "model.tpuexp")]


def _edit(folder, change):
    meta = json.loads((folder / "lm.json").read_text())
    change(meta)
    (folder / "lm.json").write_text(json.dumps(meta))


@pytest.mark.subprocess
@pytest.mark.parametrize("target,model", TARGETS)
def test_a_cache_of_ten_million_slots_is_refused_before_any_allocation(tmp_path_factory, tmp_path, target, model):
    """In a child (its own peak memory measured): `tpu-export generate` ends in one line naming lm.json, well under
    the 5 GB those caches would take, within seconds of the imports."""
    folder = copy_target(tmp_path_factory, target, tmp_path / target)
    _edit(folder, lambda m: m["cache"].update(cache_len=10**7))
    before = sorted(os.listdir(folder))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tpu_export.cli", "generate", str(folder / model), "--prompt",
                             PROMPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().strip()
    proc.stdout.close()
    proc.stderr.close()
    assert os.waitstatus_to_exitcode(status) == 1, err
    assert err.startswith(f"tpu-export: error: {folder / 'lm.json'}: its cache (2 layers x 2 heads x 10000000 slots "
                          f"x 16, float32) is not {folder / model}'s decode inputs") and len(err.splitlines()) == 1, err
    assert usage.ru_maxrss * 1024 < 2 << 30, usage.ru_maxrss  # kilobytes; the imports alone take ~1 GB
    assert time.monotonic() - t0 < 120 and sorted(os.listdir(folder)) == before


@pytest.mark.parametrize("field,value,says", [
    ("num_layers", 10**9, "cache.num_layers is 1000000000; it must be an integer in [1, 16777216]"),
    ("head_dim", -1, "cache.head_dim is -1"),
    ("kv_heads", "2", "cache.kv_heads is '2'"),
    ("dtype", "load", "cache.dtype is 'load'; one of ['float32', 'bfloat16', 'float16']"),
    ("cache_len", 32, "its cache (2 layers x 2 heads x 32 slots x 16, float32) is not"),
])
def test_bad_cache_fields_are_refused_naming_lm_json(tmp_path_factory, tmp_path, field, value, says):
    folder = copy_target(tmp_path_factory, "android", tmp_path / "android")
    _edit(folder, lambda m: m["cache"].update({field: value}))
    with pytest.raises(GeneratorError) as e:
        load_generator(folder / "model.tflite")
    assert str(e.value).startswith(f"{folder / 'lm.json'}: ") and says in str(e.value), e.value
    assert "\n" not in str(e.value)


def test_bad_stop_tokens_templates_and_json_are_one_line(tmp_path_factory, tmp_path):
    folder = copy_target(tmp_path_factory, "android", tmp_path / "android")
    lm = folder / "lm.json"
    for change, says in ((lambda m: m.update(stop_token_ids="2"), "stop_token_ids is '2', not a list"),
                         (lambda m: m.update(stop_token_ids=[2**40]), "a stop token id is 1099511627776"),
                         (lambda m: m.update(chat_template=["x"]), "chat_template is a list, not text"),
                         (lambda m: m.pop("cache"), "no 'cache' entry")):
        original = lm.read_text()
        _edit(folder, change)
        with pytest.raises(GeneratorError, match="^" + __import__("re").escape(f"{lm}: ")) as e:
            load_generator(folder / "model.tflite")
        assert says in str(e.value), e.value
        lm.write_text(original)
    lm.write_text("{not json")
    with pytest.raises(GeneratorError, match=r"lm\.json: not JSON"):
        load_generator(folder / "model.tflite")


@pytest.mark.subprocess
def test_lm_json_as_a_fifo_or_a_link_to_dev_zero_is_refused_without_waiting(tmp_path_factory, tmp_path):
    folder = copy_target(tmp_path_factory, "android", tmp_path / "android")
    (folder / "lm.json").unlink()
    os.mkfifo(folder / "lm.json")
    argv = [sys.executable, "-m", "tpu_export.cli", "generate", str(folder / "model.tflite"), "--prompt", PROMPT]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "lm.json" in r.stderr and "FIFO" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    (folder / "lm.json").unlink()
    os.symlink("/dev/zero", folder / "lm.json")
    t0 = time.monotonic()
    with pytest.raises(GeneratorError, match=r"lm\.json.*outside the folder"):
        load_generator(folder / "model.tflite")
    assert time.monotonic() - t0 < 10


def test_the_untouched_folder_still_generates(tmp_path_factory, tmp_path):
    for target, model in TARGETS:
        folder = copy_target(tmp_path_factory, target, tmp_path / target)
        assert load_generator(folder / model).generate(PROMPT, 4).new_tokens == 4
