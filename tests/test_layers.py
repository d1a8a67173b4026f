"""Imports point one way: converter (torch only) <- edge, tpu_backend <- targets <- the litert_torch facade
<- tpu_export (the application: CLI, demo, multi-target convert, op-support table; it runs a .tflite
through the facade's Model, so it sits above it).

Every import statement of shipped code is read with ast, function-local ones included, so a cycle
hidden in a function body fails here too. Shipped code never imports the test suite.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# package -> the layer it sits in; a package imports only itself and strictly lower layers (so edge and
# tpu_backend, one layer, never import each other).
LAYER = {"converter": 0, "edge": 1, "tpu_backend": 1, "targets": 2, "litert_torch": 3, "tpu_export": 4}
PACKAGES = sorted(LAYER)


def _modules():
    for pkg in PACKAGES:
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    yield pkg, os.path.join(d, f)


def _imports(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif (isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value.split(".")[0]


def test_every_package_is_checked():
    assert all(os.path.isdir(os.path.join(ROOT, p)) for p in PACKAGES)


def test_imports_point_down_and_never_into_tests():
    bad = []
    for pkg, path in _modules():
        rel = os.path.relpath(path, ROOT)
        for line, top in _imports(path):
            if top == "tests":
                bad.append(f"{rel}:{line} imports the test suite")
            elif top in LAYER and top != pkg and LAYER[top] >= LAYER[pkg]:
                bad.append(f"{rel}:{line} imports {top} (layer {LAYER[top]}) from {pkg} (layer {LAYER[pkg]})")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_function_local_imports(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from targets import x\n    import tests.zoo\n")
    assert [t for _, t in _imports(str(p))] == ["targets", "tests"]
