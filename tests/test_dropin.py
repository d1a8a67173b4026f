"""`import litert_torch` for drop-in users without silent shadowing.

tpu-export ships its facade as tpu_export.litert_torch only; the companion distribution tpu-export-litert-torch
(dropin/) provides the top-level name as one module file that aliases it. Installed next to Google's real
litert-torch 0.10.0 wheel, in either order, into scratch venvs: no file of either is overwritten (each wheel's
RECORD hashes hold), Google's package directory answers `import litert_torch` as documented, and tpu-export
warns naming both and how to choose; each choice then works.

Google's wheel is downloaded by the install step (`.venv/bin/pip download -q --no-deps litert-torch==0.10.0
-d .whl`): without it these tests skip, and fail under CI=true.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
import zipfile

import pytest

import tpu_export
from tests import test_packaging as pkg

ROOT = pkg.ROOT

DROPIN = os.path.join(ROOT, "dropin")
GOOGLE_WHEEL = os.path.join(ROOT, ".whl", "litert_torch-0.10.0-py3-none-any.whl")
# PyPI's litert_torch-0.10.0-py3-none-any.whl
GOOGLE_WHEEL_SHA256 = "431d49a2d003d4f6b8617402a84da7ecc193b1fc376a94cb415c08eed5e0540c"

# Run in a scratch venv: how `import litert_torch` resolves, what it is, and (argv[2] == 'convert') whether the
# facade under that name converts a Linear that runs as torch does. argv[1]: 'alias' (the drop-in answers the
# name) or 'google' (Google's does: the facade is used as tpu_export.litert_torch).
_PROBE = r"""
import importlib.util, json, sys, warnings
origin = importlib.util.find_spec("litert_torch").origin
with warnings.catch_warnings(record=True) as caught:  # what importing tpu-export's facade says
    warnings.simplefilter("always")
    import tpu_export, tpu_export.litert_torch as facade
    facade.warn_if_clashing()  # asked again: the warning stays one
out = {"origin": origin, "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
       "tpu_export": tpu_export.__file__}
if sys.argv[1] == "alias":
    import litert_torch
    import litert_torch.generative.export_hf as via_alias
    from litert_torch.generative import export_hf
    import tpu_export.litert_torch.generative.export_hf as real
    out["same"] = [litert_torch is facade, via_alias is real, export_hf is real,
                   litert_torch.generative is facade.generative, litert_torch.load is facade.load]
    out["spec_names"] = sorted({m.__spec__.name for k, m in sys.modules.items() if k.startswith("litert_torch")})
    out["version"] = litert_torch.__version__
    try:
        import litert_torch.no_such_module
    except ModuleNotFoundError as e:
        out["missing"] = e.name
    api = litert_torch
else:
    api = facade  # import tpu_export.litert_torch as litert_torch: always tpu-export's
if sys.argv[2] != "convert":
    print(json.dumps(out))
    sys.exit(0)
import torch
torch.manual_seed(0)
module, x = torch.nn.Linear(4, 3).eval(), torch.randn(2, 4)
got = api.convert(module, (x,))(x)
out["max_abs_err"] = float((torch.as_tensor(got) - module(x)).abs().max())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def google_wheel() -> str:
    """The path of PyPI's litert-torch 0.10.0 wheel (checked before anything is built)."""
    if not os.path.isfile(GOOGLE_WHEEL):
        msg = (f"Google's litert-torch 0.10.0 wheel is not at {GOOGLE_WHEEL}; the install step downloads it: "
               "`.venv/bin/pip download -q --no-deps litert-torch==0.10.0 -d .whl`")
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    with open(GOOGLE_WHEEL, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == GOOGLE_WHEEL_SHA256, f"{GOOGLE_WHEEL} is not PyPI's wheel"
    return GOOGLE_WHEEL


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """(tpu-export's wheel, tpu-export-litert-torch's wheel, the dependency view a scratch venv reads)."""
    tmp = tmp_path_factory.mktemp("dropin")
    _, main = pkg.build_dist(pkg.project_sources(str(tmp)), str(tmp / "main"))
    _, dropin = pkg.build_dist(DROPIN, str(tmp / "dropin"))
    return main, dropin, pkg.deps_view(str(tmp))


def _venv(tmp_path, wheels, *installs: str) -> tuple[str, str, dict]:
    """A scratch venv holding tpu-export's wheel, then each of ``installs`` by its own pip call, in order."""
    main, _, view = wheels
    venv = str(tmp_path / "venv")
    python, site = pkg.fresh_venv(venv, view)
    pkg.pip_install(python, main)
    for wheel in installs:
        pkg.pip_install(python, wheel)
    return python, site, pkg.clean_env(venv)


def _probe(python: str, env: dict, cwd, mode: str, convert: bool = True) -> dict:
    r = subprocess.run([python, "-c", _PROBE, mode, "convert" if convert else "no"], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _doctor(env: dict, cwd) -> subprocess.CompletedProcess:
    tool = os.path.join(env["PATH"].split(os.pathsep)[0], "tpu-export")
    return subprocess.run([tool, "doctor"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _intact(site: str, wheel: str) -> None:
    """Every file the wheel's RECORD lists is in site-packages with the RECORD's hash."""
    rows = pkg.record_rows(wheel)
    assert rows
    changed = [n for n, digest in rows if not os.path.isfile(os.path.join(site, n))
               or pkg.file_digest(os.path.join(site, n)) != digest]
    assert not changed, f"{os.path.basename(wheel)}: files missing or overwritten: {changed}"


def _uninstall(python: str, dist: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "--python", python, "uninstall", "-y", "-q", dist],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_dropin_is_the_same_release_and_owns_no_package_directory():
    project = tomllib.loads(open(os.path.join(DROPIN, "pyproject.toml"), encoding="utf-8").read())
    version = tpu_export.__version__
    assert project["project"]["name"] == "tpu-export-litert-torch" and project["project"]["version"] == version
    assert project["project"]["dependencies"] == [f"tpu-export=={version}"]
    assert project["tool"]["setuptools"] == {"py-modules": ["litert_torch"]}
    assert sorted(f for f in os.listdir(DROPIN) if f.endswith(".py")) == ["litert_torch.py"]
    assert open(os.path.join(DROPIN, "LICENSE"), "rb").read() == open(os.path.join(ROOT, "LICENSE"), "rb").read()


def test_doctor_reports_the_running_stack(capsys):
    import importlib.metadata

    import jax
    import torch

    from tpu_export.cli import main

    assert main(["doctor"]) == 0  # this environment has no second provider of litert_torch
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines() if line.split()[:1] != ["import"])
    # doctor reads installed metadata without importing torch: a CUDA build's __version__ adds a local label
    # ('2.14.1+cu130') that its distribution's version ('2.14.1') does not carry
    assert rows["torch"].strip() == importlib.metadata.version("torch")
    assert torch.__version__.startswith(rows["torch"].strip())
    assert rows["jax"].strip() == jax.__version__
    assert rows["libtpu"].strip() == importlib.metadata.version("libtpu")
    assert rows["tpu-export"].startswith(tpu_export.__version__ + " ")


@pytest.mark.install
@pytest.mark.subprocess
@pytest.mark.slow
def test_the_dropin_alone_answers_import_litert_torch_with_the_facade(tmp_path, wheels):
    _, dropin, _ = wheels
    python, site, env = _venv(tmp_path, wheels, dropin)
    got = _probe(python, env, tmp_path, "alias")
    assert got["origin"] == os.path.join(site, "litert_torch.py")
    assert got["tpu_export"] == os.path.join(site, "tpu_export", "__init__.py")
    assert got["same"] == [True] * 5, got["same"]
    assert all(n.startswith("tpu_export.litert_torch") for n in got["spec_names"]), got["spec_names"]
    assert got["version"] == tpu_export.__version__ and got["missing"] == "litert_torch.no_such_module"
    assert got["warnings"] == [] and got["max_abs_err"] < 1e-5
    doctor = _doctor(env, tmp_path)
    assert doctor.returncode == 0 and "warning" not in doctor.stderr
    assert f"{os.path.join(site, 'litert_torch.py')} (tpu-export-litert-torch)" in doctor.stdout


@pytest.mark.install
@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("google_first", [True, False], ids=["google-then-dropin", "dropin-then-google"])
def test_next_to_googles_litert_torch_nothing_is_replaced_and_tpu_export_says_so(google_wheel, wheels, tmp_path,
                                                                                 google_first):
    google = google_wheel
    _, dropin, _ = wheels
    python, site, env = _venv(tmp_path, wheels, *((google, dropin) if google_first else (dropin, google)))
    _intact(site, google)
    _intact(site, dropin)
    with zipfile.ZipFile(google) as z:  # the premise: Google's name is a package directory, ours one file
        assert "litert_torch/__init__.py" in z.namelist() and "litert_torch.py" not in z.namelist()

    got = _probe(python, env, tmp_path, "google")
    assert got["origin"] == os.path.join(site, "litert_torch", "__init__.py")  # Google's directory wins
    (warning,) = got["warnings"]
    assert warning.startswith("LitertTorchNameWarning: two installed distributions provide `import litert_torch`")
    for part in ("litert-torch 0.10.0 (Google's)", f"tpu-export-litert-torch {tpu_export.__version__}",
                 "it loads Google's litert-torch", "`pip uninstall litert-torch`",
                 "`import tpu_export.litert_torch as litert_torch`"):
        assert part in warning, part
    assert got["max_abs_err"] < 1e-5  # tpu-export's facade works under its own name meanwhile
    doctor = _doctor(env, tmp_path)
    assert doctor.returncode == 1
    assert doctor.stderr.count("tpu-export: warning: two installed distributions") == 1, doctor.stderr
    assert f"{os.path.join(site, 'litert_torch', '__init__.py')} (litert-torch)" in doctor.stdout
    if google_first:  # the demo's .tflite leg loads through tpu-export's facade, never Google's package
        tool = os.path.join(env["PATH"].split(os.pathsep)[0], "tpu-export")
        demo = subprocess.run([tool, "demo", "--target", "android", "-o", str(tmp_path / "demo"), "--quiet"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert demo.returncode == 0 and "all outputs match torch eager" in demo.stdout, demo.stderr[-3000:]
        assert demo.stderr.count("tpu-export: warning: two installed distributions") == 1, demo.stderr

    # each way to choose that the warning names leaves the other distribution whole and the name answered by it
    if google_first:
        _uninstall(python, "litert-torch")
        _intact(site, dropin)
        after = _probe(python, env, tmp_path, "alias", convert=False)
        assert after["origin"] == os.path.join(site, "litert_torch.py") and after["same"] == [True] * 5
    else:
        _uninstall(python, "tpu-export-litert-torch")
        _intact(site, google)
        after = _probe(python, env, tmp_path, "google", convert=False)
        assert after["origin"] == os.path.join(site, "litert_torch", "__init__.py")
    assert after["warnings"] == []
