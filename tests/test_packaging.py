"""The distribution: `python -m build` makes an sdist and a wheel offline; the wheel ships one import root
(tpu_export) with its license, version and py.typed; the checkout, the editable install, the wheel and
pyproject's package list hold the same modules; the wheel installs in a fresh venv and `tpu-export demo`
passes from it.

The helpers here (build_dist, fresh_venv) are shared with tests/test_dropin.py.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import os
import pkgutil
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
import zipfile

import pytest

import tpu_export

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYPROJECT = tomllib.loads(open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read())
PACKAGE_DIR = PYPROJECT["tool"]["setuptools"]["package-dir"]
PACKAGES = PYPROJECT["tool"]["setuptools"]["packages"]
# the flat names the repository's folders would import as if the checkout's root were the import root
FLAT = ("converter", "edge", "targets", "tpu_backend", "litert_torch")
# sha256 of the Apache License 2.0 as apache.org publishes it (https://www.apache.org/licenses/LICENSE-2.0.txt)
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
# what an sdist needs besides the package folders
SDIST_FILES = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in")


def build_dist(src: str, out: str) -> tuple[str, str]:
    """(sdist, wheel) of the project at ``src``, built by `python -m build` into ``out``: the sdist first, the
    wheel from the sdist (so the sdist is shown complete). Offline: this venv's setuptools (--no-isolation).
    ``src`` is copied first, so the build's scratch files (egg-info, build/) never land in the checkout."""
    copy = os.path.join(out, "src")
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", ".venv",
                                                             "node_modules", ".*"))
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o", out, copy], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sdist,) = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar.gz")]
    (wheel,) = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".whl")]
    return sdist, wheel


def project_sources(tmp: str) -> str:
    """A copy of what the main distribution builds from (the package folders and SDIST_FILES)."""
    src = os.path.join(tmp, "project")
    os.makedirs(src)
    for f in SDIST_FILES:
        shutil.copy2(os.path.join(ROOT, f), src)
    for folder in set(PACKAGE_DIR.values()):
        shutil.copytree(os.path.join(ROOT, folder), os.path.join(src, folder),
                        ignore=shutil.ignore_patterns("__pycache__"))
    return src


def _site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def deps_view(where: str) -> str:
    """A folder of links to this venv's installed distributions, minus every trace of tpu-export and of the
    litert_torch name (the editable install's finder and metadata, a drop-in, Google's litert-torch): a fresh
    venv reads its dependencies from here through one .pth line, without a download."""
    site = _site_packages()
    view = os.path.join(where, "deps")
    os.makedirs(view)
    for entry in os.listdir(site):
        low = entry.lower()
        if low.startswith(("tpu_export", "__editable__", "litert_torch", "__pycache__")) or low.endswith(".pth"):
            continue
        os.symlink(os.path.join(site, entry), os.path.join(view, entry))
    return view


def fresh_venv(where: str, view: str) -> tuple[str, str]:
    """(python, site-packages) of a new venv (no pip: this venv's pip installs into it) whose .pth shows it
    ``view``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True, timeout=120)
    python = os.path.join(where, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    with open(os.path.join(site, "_tpu_export_test_deps.pth"), "w", encoding="utf-8") as f:
        f.write(view + "\n")
    return python, site


def pip_install(python: str, *args: str) -> None:
    """`pip install --no-deps --no-index ARGS` into the venv of ``python`` (this venv's pip, --python); no
    bytecode compiled at install time (the scratch venvs import a few modules once)."""
    r = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                        "--no-index", "--no-compile", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def clean_env(venv: str) -> dict:
    """The environment a user of ``venv`` has: its bin first, no PYTHONPATH of ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    return env


def record_rows(wheel: str) -> list[tuple[str, str]]:
    """(path, "sha256=...") of every hashed file a wheel's RECORD lists."""
    with zipfile.ZipFile(wheel) as z:
        (record,) = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(z.read(record).decode("utf-8"))))
    return [(path, digest) for path, digest, *_ in rows if digest]


def file_digest(path: str) -> str:
    import base64

    with open(path, "rb") as f:
        raw = hashlib.sha256(f.read()).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


# --- what the modules are, read four ways ---------------------------------------------------------------------


def _folder_of(package: str) -> str:
    """The repository folder setuptools builds ``package`` from (package-dir, longest prefix)."""
    best = max((k for k in PACKAGE_DIR if package == k or package.startswith(k + ".")), key=len)
    rest = package[len(best):].lstrip(".")
    return os.path.join(PACKAGE_DIR[best], *filter(None, rest.split(".")))


def _package_of_folder(folder: str) -> str:
    """The package name a repository folder installs as (the inverse of package-dir)."""
    best = max((k for k, v in PACKAGE_DIR.items() if folder == v or folder.startswith(v + os.sep)),
               key=lambda k: len(PACKAGE_DIR[k]))
    rest = os.path.relpath(folder, PACKAGE_DIR[best])
    return best if rest == "." else best + "." + rest.replace(os.sep, ".")


def _module_name(package: str, filename: str) -> str:
    stem = filename[:-3]
    return package if stem == "__init__" else f"{package}.{stem}"


def checkout_modules() -> dict[str, str]:
    """Every .py file under the folders package-dir names, as module name -> its path in the checkout; a .py
    in a folder without __init__.py would not install and is named as such."""
    found = {}
    for folder in set(PACKAGE_DIR.values()):
        for d, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            rel = os.path.relpath(d, ROOT)
            py = sorted(f for f in files if f.endswith(".py"))
            if py and "__init__.py" not in files:
                found.update({f"<no __init__.py in {rel}>/{f}": os.path.join(d, f) for f in py})
                continue
            found.update({_module_name(_package_of_folder(rel), f): os.path.join(d, f) for f in py})
    return found


def listed_modules() -> set[str]:
    """The modules pyproject's `packages` list covers (each listed package's folder's own .py files)."""
    names = set()
    for package in PACKAGES:
        folder = os.path.join(ROOT, _folder_of(package))
        names |= {_module_name(package, f) for f in os.listdir(folder) if f.endswith(".py")}
    return names


def wheel_modules(wheel: str) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {_module_name(os.path.dirname(n).replace("/", "."), os.path.basename(n))
                for n in z.namelist() if n.endswith(".py")}


def _editable_mapping() -> dict[str, str]:
    """The editable install's package -> folder map (setuptools' finder on sys.meta_path); {} when tpu_export
    is installed from a wheel."""
    for finder in sys.meta_path:
        mapping = getattr(sys.modules.get(getattr(finder, "__module__", "")), "MAPPING", None)
        if isinstance(mapping, dict) and "tpu_export" in mapping:
            return mapping
    return {}


def installed_modules() -> dict[str, str]:
    """The modules the running interpreter finds by walking tpu_export (module name -> the file it loads): each
    package's folder as the import system resolves it, plus the subpackages the editable finder maps from
    other folders (pkgutil walks a package's own folder only)."""
    mapping = _editable_mapping()
    found, todo = {}, ["tpu_export"]
    while todo:
        name = todo.pop()
        spec = importlib.util.find_spec(name)
        found[name] = spec.origin
        if spec.submodule_search_locations is None:
            continue
        children = {f"{name}.{m.name}" for m in pkgutil.iter_modules(spec.submodule_search_locations)}
        todo += children | {k for k in mapping if k.rpartition(".")[0] == name}
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dist"))
    t0 = time.perf_counter()
    sdist, wheel = build_dist(project_sources(out), out)
    print(f"python -m build (sdist, then the wheel from it): {time.perf_counter() - t0:.1f} s")
    return sdist, wheel


# --- tests ----------------------------------------------------------------------------------------------------


def test_every_package_folder_is_listed_and_the_editable_install_loads_the_checkout():
    here = checkout_modules()
    unpackaged = [n for n in here if n.startswith("<")]
    assert not unpackaged, f"these .py files would not install (no __init__.py): {unpackaged}"
    # a package folder missing from `packages` is importable from the checkout and the editable install but
    # absent from the wheel
    assert set(here) == listed_modules(), sorted(set(here) ^ listed_modules())
    installed = installed_modules()
    assert set(installed) == set(here), sorted(set(installed) ^ set(here))
    if _editable_mapping():
        wrong = {n: o for n, o in installed.items() if not os.path.samefile(o, here[n])}
        assert not wrong, f"the editable install loads these from elsewhere than the checkout: {wrong}"


@pytest.mark.install
def test_the_wheel_ships_one_import_root_with_license_version_and_types(built):
    sdist, wheel = built
    version = tpu_export.__version__
    dist_info = f"tpu_export-{version}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert {n.split("/")[0] for n in names} == {"tpu_export", dist_info}  # no converter/, edge/, litert_torch/..
        assert "tpu_export/py.typed" in names
        metadata = z.read(f"{dist_info}/METADATA").decode("utf-8")
        shipped_license = z.read(f"{dist_info}/licenses/LICENSE")
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode("utf-8")
    head = dict(line.split(": ", 1) for line in metadata.split("\n\n")[0].splitlines() if ": " in line)
    assert head["Name"] == "tpu-export" and head["Version"] == version
    assert head["License-Expression"] == "Apache-2.0"
    assert shipped_license == open(os.path.join(ROOT, "LICENSE"), "rb").read()
    assert "tpu-export = tpu_export.cli:main" in entry_points
    assert os.path.basename(wheel) == f"tpu_export-{version}-py3-none-any.whl"
    with tarfile.open(sdist) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
        pkg_info = t.extractfile(f"tpu_export-{version}/PKG-INFO").read().decode("utf-8")
    assert set(SDIST_FILES) <= members and f"Version: {version}\n" in pkg_info
    checkout = {os.path.relpath(p, ROOT) for p in checkout_modules().values()}
    sdist_py = {m for m in members if m.endswith(".py")}
    assert sdist_py == checkout, sorted(sdist_py ^ checkout)  # the package sources and nothing else (no tests/)


@pytest.mark.install
def test_checkout_editable_install_wheel_and_package_list_hold_the_same_modules(built):
    _, wheel = built
    in_wheel = wheel_modules(wheel)
    assert in_wheel == set(installed_modules()) == listed_modules() == set(checkout_modules()), (
        sorted(in_wheel ^ set(installed_modules())))


@pytest.mark.subprocess
def test_importing_every_module_loads_no_flat_name():
    """Every tpu_export module imported in one process whose working directory is the checkout's root, where
    the flat names (converter, edge, ...) are importable: none of them is loaded, and each module comes from
    the file the walk found."""
    expected = installed_modules()
    code = (
        "import importlib, json, sys\n"
        "names = json.loads(sys.argv[1])\n"
        "files = {n: importlib.import_module(n).__file__ for n in names}\n"
        f"flat = sorted(k for k in sys.modules if k.split('.')[0] in {FLAT!r})\n"
        "print(json.dumps({'files': files, 'flat': flat}))\n"
    )
    import json

    r = subprocess.run([sys.executable, "-c", code, json.dumps(sorted(expected))], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["flat"] == [], f"flat module objects loaded: {got['flat']}"
    moved = {n: f for n, f in got["files"].items() if not os.path.samefile(f, expected[n])}
    assert not moved


def test_one_version_everywhere():
    from tpu_export.converter import _version
    from tpu_export.litert_torch import __version__ as facade_version

    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": f"{_version.__name__}.__version__"}
    assert tpu_export.__version__ == facade_version == _version.__version__
    from packaging.version import Version

    assert str(Version(tpu_export.__version__)) == tpu_export.__version__  # a canonical PEP 440 version


def test_license_is_the_apache_2_text_and_the_changelog_names_this_release():
    with open(os.path.join(ROOT, "LICENSE"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == APACHE_2_SHA256
    assert PYPROJECT["project"]["license"] == "Apache-2.0" and PYPROJECT["project"]["license-files"] == ["LICENSE"]
    changelog = open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8").read()
    headings = [ln for ln in changelog.splitlines() if ln.startswith("## ")]
    assert headings and headings[0].startswith(f"## {tpu_export.__version__}"), headings[:1]


@pytest.mark.install
@pytest.mark.slow
@pytest.mark.subprocess
def test_the_wheel_installs_in_a_fresh_venv_and_the_demo_passes_from_it(built, tmp_path):
    _, wheel = built
    venv = str(tmp_path / "venv")
    python, site = fresh_venv(venv, deps_view(str(tmp_path)))
    pip_install(python, wheel)
    env = clean_env(venv)
    work = tmp_path / "elsewhere"  # outside the checkout: nothing of it is on sys.path
    work.mkdir()
    where = subprocess.run([python, "-c", "import tpu_export; print(tpu_export.__file__, tpu_export.__version__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    path, version = where.stdout.split()
    assert os.path.samefile(path, os.path.join(site, "tpu_export", "__init__.py")) and version == tpu_export.__version__
    for n, digest in record_rows(wheel):  # the installed files are the wheel's
        assert file_digest(os.path.join(site, n)) == digest, n
    t0 = time.perf_counter()
    r = subprocess.run([os.path.join(venv, "bin", "tpu-export"), "demo", "-o", str(work / "demo"), "--quiet"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=900)
    took = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all outputs match torch eager" in r.stdout
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.split()[:1] in (["cnn"], ["transformer"])]
    assert {(row[0], row[1]) for row in rows} == {(m, t) for m in ("cnn", "transformer")
                                                   for t in ("tpu-v6e", "android")}
    assert all(row[-1].startswith(str(work / "demo")) for row in rows)
    print(f"tpu-export demo from the fresh venv: {took:.1f} s")
