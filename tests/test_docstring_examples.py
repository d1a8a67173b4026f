"""The ``Examples:`` sections of the public entry points' docstrings (rendered in the API reference, docs/api/) run
as doctests: each module's examples pass, and each module has some.

The examples that need an LLM model directory read it from ``model_dir``, a tiny seeded Hugging Face model
directory built here offline (tests/llm_models.py); the docstrings say so where they use it.
"""

from __future__ import annotations

import doctest
import importlib
import io

import pytest

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# module -> the tier markers its examples need (tests/conftest.py: unmarked is the fast tier)
MODULES = {
    "tpu_export.converter.program": (),
    "tpu_export.converter.pipeline": (),
    "tpu_export.converter.registry": (),
    "tpu_export.multi_target": (),
    "tpu_export.litert_torch._convert": (),
    "tpu_export.litert_torch._model": (),
    "tpu_export.litert_torch._config": (),
    "tpu_export.litert_torch.hlfb": (),
    "tpu_export.litert_torch.debug.culprit": (),
    "tpu_export.litert_torch.generative.quantize.quant_recipes": (),
    "tpu_export.litert_torch.generative.quantize.supported_schemes": (),
    "tpu_export.tpu_backend.runtime": (),
    "tpu_export.tpu_backend.artifact.store": (),
    "tpu_export.tpu_backend.aot": (pytest.mark.libtpu,),  # compile_for: a TPU AOT compile (libtpu, ~1 s)
    "tpu_export.targets.lm": (pytest.mark.slow,),  # convert_lm of a tiny LLM
    "tpu_export.litert_torch.generative.export_hf.export": (pytest.mark.slow,),
    "tpu_export.generators": (pytest.mark.slow, pytest.mark.engine),  # the LiteRT-LM engine's generate
}
# the modules whose examples read ``model_dir``
NEEDS_MODEL_DIR = {"tpu_export.targets.lm", "tpu_export.litert_torch.generative.export_hf.export",
                   "tpu_export.generators"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tiny Llama as a Hugging Face model directory (config, safetensors weights, tokenizer, chat template)."""
    from tests.llm_models import save_model_dir

    return str(save_model_dir("llama", tmp_path_factory.mktemp("docs") / "llama"))


def run_examples(module, extraglobs: dict) -> tuple[int, int, str]:
    """(failed, attempted, the failures' report) of the doctests in ``module``'s own docstrings."""
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report = io.StringIO()
    for test in doctest.DocTestFinder().find(module, module.__name__, extraglobs=extraglobs):
        runner.run(test, out=report.write)
    return runner.failures, runner.tries, report.getvalue()


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, m in MODULES.items()])
def test_docstring_examples_pass(name, request):
    module = importlib.import_module(name)
    extraglobs = {"model_dir": request.getfixturevalue("model_dir")} if name in NEEDS_MODEL_DIR else {}
    failed, attempted, report = run_examples(module, extraglobs)
    assert attempted > 0, f"{name}: no docstring example ran"
    assert failed == 0, f"{name}: {failed} of {attempted} docstring examples failed:\n{report[-6000:]}"
