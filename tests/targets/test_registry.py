"""The target registry: names, unknown-name errors, TPU chip facts and topology errors."""

from __future__ import annotations

import pytest

from tpu_export import targets
from tpu_export.targets import TARGETS, UnknownTargetError, get_target

EXPECTED = {"android", "ios", "web", "iot", "cpu", "tpu-v5e", "tpu-v6e", "tpu-v5p", "tpu-v7x", "cuda", "cpu-xla"}


def test_every_issue_target_is_registered_with_checks_and_packaging():
    assert EXPECTED <= set(TARGETS)
    for t in TARGETS.values():
        assert t.backend in ("tpu", "edge")
        assert t.summary and t.checks and t.packaging, t.name
        if t.backend == "edge":
            assert t.delegates, t.name


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(UnknownTargetError) as e:
        get_target("raspberry-pi")
    for name in EXPECTED:
        assert name in str(e.value)


def test_compatibility_rejects_unknown_target_and_delegate():
    from tpu_export.targets.compat import compatibility

    with pytest.raises(UnknownTargetError):
        compatibility(b"", "nokia")
    with pytest.raises(ValueError, match="does not produce a .tflite"):
        compatibility(b"", "tpu-v6e")
    with pytest.raises(ValueError, match="unknown delegate 'nnapi'; known: gpu, coreml, metal, tflm, cpu"):
        compatibility(b"", "android", delegate="nnapi")


@pytest.mark.parametrize("name", ["tpu-v5e", "tpu-v6e", "tpu-v5p", "tpu-v7x"])
def test_tpu_targets_carry_chip_facts(name):
    chip = targets.chip_facts(name)
    assert chip.hbm_bytes_per_chip >= 16 * 1024**3
    assert chip.peak_bf16_flops_per_chip >= 1e14
    assert chip.libtpu_name == get_target(name).chip
    assert chip.source.startswith("https://cloud.google.com/tpu/")
    topo = targets.check_topology(name)  # the target's default topology is valid
    assert topo.libtpu_name == f"{chip.libtpu_name}:{get_target(name).default_topology}"


def test_invalid_topology_lists_the_valid_ones():
    from tpu_export.tpu_backend.chips import InvalidTopologyError

    with pytest.raises(InvalidTopologyError) as e:
        targets.check_topology("tpu-v6e", "3x5")
    assert "2x2" in str(e.value) and "4x4" in str(e.value)
    with pytest.raises(InvalidTopologyError):
        targets.check_for_target(None, "tpu-v5p", topology="2x2x3", say=lambda m: None)


def test_chip_facts_refuse_non_tpu_target():
    with pytest.raises(ValueError, match="not a TPU generation"):
        targets.chip_facts("cuda")
