"""Griffe extension for the API reference (mkdocs.yml): the package tree as it installs.

pyproject.toml's package-dir installs the folders converter/, edge/, targets/, tpu_backend/ and litert_torch/ as
tpu_export.converter, tpu_export.edge, ...; griffe reads a package from one folder, so without this extension it
sees only tpu_export/. Each mapped folder is read as the subpackage it installs as, and the names a package
resolves on first use (its ``_WHERE`` table, converter/lazy_exports.py) become aliases of the objects they
resolve to, so that ``::: tpu_export.convert`` documents what ``tpu_export.convert`` is. Nothing is imported.
"""

from __future__ import annotations

import ast
import pathlib
import tomllib

import griffe

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOP = "tpu_export"


def _visit(loader: griffe.GriffeLoader, name: str, path: pathlib.Path, parent: griffe.Module) -> griffe.Module:
    code = path.read_text(encoding="utf-8")
    if loader.store_source:
        loader.lines_collection[path] = code.splitlines(keepends=False)
    return griffe.visit(name, filepath=path, code=code, extensions=loader.extensions, parent=parent,
                        docstring_parser=loader.docstring_parser, docstring_options=loader.docstring_options,
                        lines_collection=loader.lines_collection, modules_collection=loader.modules_collection)


def _visit_package(loader: griffe.GriffeLoader, name: str, folder: pathlib.Path,
                   parent: griffe.Module) -> griffe.Module:
    pkg = _visit(loader, name, folder / "__init__.py", parent)
    parent.set_member(name, pkg)
    for child in sorted(folder.iterdir()):
        if child.is_dir() and (child / "__init__.py").is_file():
            _visit_package(loader, child.name, child, pkg)
        elif child.suffix == ".py" and child.name != "__init__.py":
            pkg.set_member(child.stem, _visit(loader, child.stem, child, pkg))
    return pkg


def _lazy_table(module: griffe.Module) -> dict[str, str]:
    """The module's ``_WHERE`` dict literal (name -> submodule), or {}."""
    attr = module.members.get("_WHERE")
    if attr is None or attr.is_alias or attr.value is None:
        return {}
    try:
        table = ast.literal_eval(str(attr.value))
    except (ValueError, SyntaxError):
        return {}
    return table if isinstance(table, dict) else {}


def _add_lazy_aliases(module: griffe.Module) -> None:
    for name, where in _lazy_table(module).items():
        if name not in module.members:
            module.set_member(name, griffe.Alias(name, f"{module.path}.{where}.{name}", parent=module))
    for sub in list(module.modules.values()):
        if not sub.is_alias:
            _add_lazy_aliases(sub)


class PackageDir(griffe.Extension):
    """Adds pyproject.toml's package-dir folders and the lazy facade names to the loaded ``tpu_export``."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: object) -> None:
        if pkg.name != TOP:
            return
        setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
        for name, folder in sorted(setuptools["package-dir"].items(), key=lambda kv: kv[0].count(".")):
            parent_path, _, child = name.rpartition(".")
            if parent_path != TOP:  # the root itself (read by griffe), or a deeper mapping (none today)
                continue
            _visit_package(loader, child, ROOT / folder, pkg)
        _add_lazy_aliases(pkg)
        loader.expand_exports(pkg)
