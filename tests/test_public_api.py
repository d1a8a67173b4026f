"""Every package of tpu_export names its public surface in ``__all__``, each of those names resolves (the
packages load their modules lazily, so a stale entry would only fail on first use), and each package says
that its submodules are internal."""

import importlib

import pytest

PACKAGES = [
    "tpu_export",
    "tpu_export.converter",
    "tpu_export.converter.onnx",
    "tpu_export.converter.passes",
    "tpu_export.edge",
    "tpu_export.explore",
    "tpu_export.targets",
    "tpu_export.targets.compat",
    "tpu_export.tpu_backend",
    "tpu_export.tpu_backend.artifact",
    "tpu_export.tpu_backend.llm",
    "tpu_export.tpu_backend.lowering",
    "tpu_export.tpu_backend.pallas",
    "tpu_export.litert_torch",
    "tpu_export.litert_torch.generative",
    "tpu_export.litert_torch.generative.export_hf",
    "tpu_export.litert_torch.generative.quantize",
    "tpu_export.litert_torch.debug",
    "tpu_export.serve",
    "tpu_export.litert_torch.quantize",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_public_names_resolve(name):
    pkg = importlib.import_module(name)
    assert isinstance(pkg.__all__, list) and pkg.__all__, f"{name} has no __all__"
    assert len(set(pkg.__all__)) == len(pkg.__all__), f"{name}.__all__ repeats a name"
    missing = [n for n in pkg.__all__ if getattr(pkg, n, None) is None]
    assert not missing, f"{name}.__all__ names what the package does not provide: {missing}"


@pytest.mark.parametrize("name", [p for p in PACKAGES if p not in ("tpu_export", "tpu_export.litert_torch")])
def test_submodules_are_documented_as_internal(name):
    doc = importlib.import_module(name).__doc__ or ""
    assert "submodules are internal" in doc, f"{name}'s docstring does not say which names are public"


def test_an_unknown_name_is_an_attribute_error():
    from tpu_export import converter, edge

    for pkg in (converter, edge):
        with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
            pkg.not_a_name  # noqa: B018
