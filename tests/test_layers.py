"""Imports point one way: converter (torch only) <- edge, tpu_backend <- targets <- the litert_torch facade
<- the application (tpu_export's own modules: CLI, demo, multi-target convert, op-support table; it runs a
.tflite through the facade's Model, so it sits above it).

Every import statement of shipped code is read with ast, function-local ones included, so a cycle hidden
in a function body fails here too. Each layer may import only the third-party packages listed for it, an
``importlib.import_module`` whose module name is not a literal is refused outside the few places that
resolve names inside their own package, and shipped code never imports the test suite.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# repository folder -> (installed package, layer); a package imports only itself and strictly lower layers
# (so edge and tpu_backend, one layer, never import each other).
FOLDERS = {
    "converter": ("tpu_export.converter", 0),
    "edge": ("tpu_export.edge", 1),
    "tpu_backend": ("tpu_export.tpu_backend", 1),
    "targets": ("tpu_export.targets", 2),
    "litert_torch": ("tpu_export.litert_torch", 3),
    "tpu_export": ("tpu_export", 4),
}
LAYER_OF = {pkg: layer for pkg, layer in FOLDERS.values()}

# The third-party imports each layer may make: converter knows torch and nothing of jax or LiteRT, edge
# nothing of jax, tpu_backend nothing of LiteRT. A new dependency is added here on purpose.
_CAPTURE = {"torch", "numpy", "ml_dtypes", "safetensors", "onnx", "transformers"}
_EDGE = _CAPTURE | {"ai_edge_litert", "ai_edge_quantizer", "flatbuffers", "litert_lm_builder", "google", "jinja2",
                    "sympy"}
_TPU = _CAPTURE | {"jax", "jaxlib", "sympy"}
_TARGETS = _EDGE | _TPU | {"tflite_micro"}
# torchao: litert_torch.quantize's PT2EQuantizer subclasses its Quantizer (prepare_pt2e moved there from torch.ao)
_APP = _TARGETS | {"tokenizers", "litert_lm", "torchao"}
# tpu_export.serve: the HTTP server's stack (the serve extra)
_APP = _APP | {"starlette", "uvicorn", "prometheus_client"}
# tpu_export.serve.ray_app: the same server as N replicas on Ray Serve (the ray extra)
_APP = _APP | {"ray"}
# tpu_export.explore: Model Explorer's server and its graph adapters (the explore extra)
_APP = _APP | {"model_explorer", "ai_edge_model_explorer_adapter"}
THIRD_PARTY = {0: _CAPTURE, 1: None, 2: _TARGETS, 3: _APP, 4: _APP}
THIRD_PARTY_BY_FOLDER = {"edge": _EDGE, "tpu_backend": _TPU}
NEVER = {"converter": {"jax", "jaxlib", "libtpu", "ai_edge_litert", "ai_edge_quantizer", "flatbuffers",
                       "litert_lm", "litert_lm_builder", "tflite_micro"},
         "edge": {"jax", "jaxlib", "libtpu"},
         "tpu_backend": {"ai_edge_litert", "ai_edge_quantizer", "flatbuffers", "litert_lm_builder"}}

# (file, enclosing function) allowed to call import_module with a computed name: each resolves names only
# inside the package that calls it (a lazy facade's submodule, an op table's ops_<family> files) or is the
# CLI's MODEL argument 'package.module:factory', the user's own code that the user asks us to run.
COMPUTED_IMPORTS_OK = {
    ("converter/lazy_exports.py", "__getattr__"),
    ("converter/registry.py", "import_op_families"),
    ("tpu_export/cli.py", "load_model_spec"),
}


def _package_of(rel: str) -> str:
    """The installed package a shipped file belongs to: 'converter/onnx/x.py' -> 'tpu_export.converter'."""
    return FOLDERS[rel.split(os.sep)[0]][0]


def _modules():
    for folder in sorted(FOLDERS):
        for d, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(d, f)
                    yield os.path.relpath(path, ROOT), path


def _project_package(name: str) -> str | None:
    """The layer package a 'tpu_export...' module name belongs to (the longest match), else None."""
    best = None
    for pkg in LAYER_OF:
        if (name == pkg or name.startswith(pkg + ".")) and (best is None or len(pkg) > len(best)):
            best = pkg
    return best


def _imports(path):
    """(line, module name, enclosing function or None) for every import in ``path``; a computed
    import_module argument yields the name None."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def func_of(node):
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, func_of(node)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "tpu_export":  # from tpu_export import converter: the submodule is the import
                for a in node.names:
                    yield node.lineno, f"tpu_export.{a.name}", func_of(node)
            else:
                yield node.lineno, node.module, func_of(node)
        elif (isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith("."):
                yield node.lineno, arg.value, func_of(node)
            elif not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                yield node.lineno, None, func_of(node)


def _third_party_allowed(folder: str) -> set:
    return THIRD_PARTY_BY_FOLDER.get(folder) or THIRD_PARTY[FOLDERS[folder][1]]


def _violations(rel: str, path: str) -> list[str]:
    import sys

    folder = rel.split(os.sep)[0]
    pkg = _package_of(rel)
    layer = LAYER_OF[pkg]
    bad = []
    for line, name, func in _imports(path):
        where = f"{rel}:{line}"
        if name is None:
            if (rel, func) not in COMPUTED_IMPORTS_OK:
                bad.append(f"{where} calls import_module with a computed name (in {func or 'module scope'})")
            continue
        top = name.split(".")[0]
        if top == "tests":
            bad.append(f"{where} imports the test suite")
        elif top in FOLDERS and top != "tpu_export":
            bad.append(f"{where} imports the flat name {name!r}: installed, it is tpu_export.{name}")
        elif top == "tpu_export":
            target = _project_package(name)
            if target is not None and target != pkg and LAYER_OF[target] >= layer:
                bad.append(f"{where} imports {target} (layer {LAYER_OF[target]}) from {pkg} (layer {layer})")
        elif top not in sys.stdlib_module_names:
            if top in NEVER.get(folder, ()):
                bad.append(f"{where} imports {top}, which {folder} must never import")
            elif top not in _third_party_allowed(folder):
                bad.append(f"{where} imports {top}, not among the third-party packages {folder} may import")
    return bad


def test_every_package_is_checked():
    assert all(os.path.isdir(os.path.join(ROOT, p)) for p in FOLDERS)
    assert sum(1 for _ in _modules()) > 150


@pytest.mark.slow
def test_imports_point_down_and_never_into_tests():
    bad = [v for rel, path in _modules() for v in _violations(rel, path)]
    assert not bad, "\n".join(bad)


def _write(tmp_path, folder: str, text: str) -> tuple[str, str]:
    d = tmp_path / folder
    d.mkdir(exist_ok=True)
    p = d / "m.py"
    p.write_text(text)
    return os.path.join(folder, "m.py"), str(p)


@pytest.mark.subprocess
def test_the_checker_sees_function_local_imports(tmp_path):
    _, p = _write(tmp_path, "converter", "def f():\n    from tpu_export.targets import x\n    import tests.zoo\n")
    assert [(n, f) for _, n, f in _imports(p)] == [("tpu_export.targets", "f"), ("tests.zoo", "f")]


def test_the_checker_refuses_each_kind_of_violation(tmp_path):
    cases = {
        ("converter", "import jax\n"): "which converter must never import",
        ("converter", "from ai_edge_litert import interpreter\n"): "which converter must never import",
        ("converter", "import flatbuffers\n"): "which converter must never import",
        ("edge", "def f():\n    import jax.numpy\n"): "which edge must never import",
        ("edge", "from tpu_export import tpu_backend\n"): "imports tpu_export.tpu_backend (layer 1)",
        ("converter", "from tpu_export.edge.lower import x\n"): "imports tpu_export.edge (layer 1)",
        ("targets", "import converter\n"): "the flat name 'converter'",
        ("targets", "import requests\n"): "not among the third-party packages targets may import",
        ("edge", "import importlib\nname = 'x'\nimportlib.import_module(name)\n"): "computed name (in module",
        ("tpu_backend", "from tests import zoo\n"): "imports the test suite",
    }
    for (folder, text), want in cases.items():
        rel, path = _write(tmp_path, folder, text)
        got = _violations(rel, path)
        assert any(want in g for g in got), (folder, text, got)


def test_the_checker_allows_what_the_design_allows(tmp_path):
    ok = [("converter", "import torch\nimport numpy\nfrom tpu_export.converter import program\n"),
          ("targets", "from tpu_export import edge, tpu_backend\nfrom tpu_export.converter import x\n"),
          ("tpu_export", "from tpu_export.litert_torch import Model\nimport importlib\n"
                         "importlib.import_module('tpu_export.edge')\n")]
    for folder, text in ok:
        rel, path = _write(tmp_path, folder, text)
        assert _violations(rel, path) == [], (folder, text)
