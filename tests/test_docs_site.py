"""The documentation site (mkdocs.yml) builds with ``mkdocs build --strict``: every page in the nav, every link and
anchor between pages resolving, every docstring the API reference renders parsing without a warning. The API
pages (docs/api/) come out with the public entry points in them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# page of the built site -> entry points (as their headings name them) it must document
API_PAGES = {
    "api/litert_torch/index.html": ["tpu_export.litert_torch.convert", "tpu_export.litert_torch.signature",
                                    "tpu_export.litert_torch.Converter", "tpu_export.litert_torch.Model",
                                    "tpu_export.litert_torch.load"],
    "api/convert/index.html": ["tpu_export.convert"],
    "api/tpu/index.html": ["tpu_export.tpu_backend.export_program", "tpu_export.tpu_backend.ExportedBundle.save",
                           "tpu_export.tpu_backend.ExportedBundle.compile_for", "tpu_export.tpu_backend.save",
                           "tpu_export.tpu_backend.compile_for", "tpu_export.tpu_backend.load",
                           "tpu_export.tpu_backend.TpuProgram"],
    "api/llm/index.html": ["tpu_export.convert_lm", "tpu_export.litert_torch.generative.export_hf.export.export",
                           "tpu_export.load_generator", "tpu_export.generators.LoopGenerator.generate",
                           "tpu_export.generators.EngineGenerator.generate"],
    "api/custom_ops/index.html": ["tpu_export.edge.lowering", "tpu_export.converter.registry.LoweringRegistry.lowering",
                                  "tpu_export.converter.registry.supported_if"],
    "api/core/index.html": ["tpu_export.converter.prepare", "tpu_export.converter.Program",
                            "tpu_export.converter.Signature", "tpu_export.converter.TensorSpec"],
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("site"))
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", out], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert "WARNING" not in r.stderr, r.stderr[-6000:]
    return out


@pytest.mark.subprocess
def test_the_site_builds_strict_with_the_guides(site):
    for page in ("index.html", "usage/index.html", "tpu/index.html", "llm/index.html", "custom_ops/index.html",
                 "api/index.html"):
        assert os.path.isfile(os.path.join(site, page)), page
    assert not os.path.exists(os.path.join(site, "hooks")), "the griffe extension is not a page"


@pytest.mark.subprocess
@pytest.mark.parametrize("page", sorted(API_PAGES))
def test_the_api_pages_document_the_entry_points(site, page):
    with open(os.path.join(site, page), encoding="utf-8") as f:
        html = f.read()
    missing = [name for name in API_PAGES[page] if f'id="{name}"' not in html]
    assert not missing, f"{page} has no section for {missing}"
    assert "Examples:" in html and "&gt;&gt;&gt;" in html, f"{page} shows no examples"
