"""A config.json as transformers' save_pretrained writes a float JSON has no literal for ({"__float__": "Infinity"},
GraniteMoeHybrid's default time_step_limit) reads back as that float (targets.lm_dir.hf_config), as transformers'
own from_pretrained reads it."""

import json
import math

import pytest

transformers = pytest.importorskip("transformers")


def test_an_infinite_float_in_config_json_reads_back(tmp_path):
    from tpu_export.targets.lm_dir import hf_config

    cfg = transformers.GraniteMoeHybridConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                              mamba_n_heads=8, mamba_d_head=16)
    cfg.save_pretrained(tmp_path)
    parsed = json.loads((tmp_path / "config.json").read_text())
    assert parsed["time_step_limit"][1] == {"__float__": "Infinity"}
    got = hf_config(parsed, "config.json")
    assert tuple(got.time_step_limit) == (0.0, math.inf)
    assert tuple(got.time_step_limit) == tuple(transformers.AutoConfig.from_pretrained(tmp_path).time_step_limit)
