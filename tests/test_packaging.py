"""The package as users install it: a wheel and an sdist, each built from this checkout and
installed into a fresh virtual environment, then used from a folder outside the checkout.

The venv sees the packages of the interpreter running the tests (torch and the other
dependencies are there already: installing them again would download gigabytes), whether that
interpreter is a system Python or itself a virtual environment; attnbench itself comes only from
the built file, so a module or a scenario missing from the wheel fails here.
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"wheel": next(out.glob("*.whl")), "sdist": next(out.glob("*.tar.gz"))}


def _running_site_dirs() -> list[str]:
    """The site-packages folders this interpreter imports from, in its sys.path order: a venv's
    own (and its base's when it was made with system site packages), a system Python's, the user
    site when it is on. Never the checkout, PYTHONPATH or the standard library."""
    dirs = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return [p for p in dict.fromkeys(sys.path) if p in dirs and os.path.isdir(p)]


def _see_running_packages(py: Path) -> None:
    """Put the running interpreter's site-packages on the new venv's path, after its own.

    `system_site_packages=True` would show the *base* interpreter's packages, which is not where
    the dependencies are when the tests run in a venv (typer was missing there). A .pth file of
    plain folder lines adds the folders without running their own .pth files, so an editable
    attnbench installed there (a finder hook in a .pth) stays out; the venv's own site-packages
    comes first, so the attnbench installed from the built file is the one imported."""
    inner_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True,
                                env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout.strip()
    (Path(inner_site) / "_attnbench_test_running_packages.pth").write_text("".join(d + "\n" for d in _running_site_dirs()))


def _install(dist: Path, where: Path) -> Path:
    env_dir = where / "venv"
    venv.EnvBuilder(system_site_packages=False, with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    _see_running_packages(py)
    # --no-deps: the dependencies come from the running interpreter's packages; --no-build-isolation
    # for the sdist would need setuptools>=68 here, so the sdist builds isolated like a user's does.
    # without PYTHONPATH (a checkout on it made pip take attnbench as installed already and skip the wheel)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(dist)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return env_dir / "bin"


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_package_runs_a_builtin_scenario_outside_the_checkout(dists, kind, tmp_path):
    bin_dir = _install(dists[kind], tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["ATTNBENCH_CACHE_DIR"] = str(tmp_path / "cache")

    def attnbench(*args):
        return subprocess.run([str(bin_dir / "attnbench"), *args], cwd=work, env=env, capture_output=True, text=True,
                              timeout=600)

    where = subprocess.run([str(bin_dir / "python"), "-c", "import attnbench; print(attnbench.__file__)"], cwd=work,
                           env=env, capture_output=True, text=True)
    assert str(tmp_path / "venv") in where.stdout, (where.stdout, where.stderr)  # not the checkout's copy
    v = attnbench("--version")
    assert v.returncode == 0 and "0.1.0" in v.stdout, v.stdout + v.stderr
    listed = attnbench("scenarios")
    assert listed.returncode == 0 and "quickstart" in listed.stdout and "gpu/odd-pages" in listed.stdout, listed.stdout
    run = attnbench("run", "quickstart", "--device", "cpu", "-b", "reference", "-b", "sdpa", "--out", "run", "-q",
                    "--measure-ms", "5", "--warmup-ms", "1")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (work / "run" / "rows.jsonl").read_text().count('"status": "ok"') == 4  # 2 cases x 2 backends


def test_builtin_backends_and_scenarios_live_inside_the_package():
    """Nothing is mapped into the package from elsewhere: what the build finds is the tree."""
    assert not (ROOT / "backends").exists() and not (ROOT / "scenarios").exists()
    text = (ROOT / "pyproject.toml").read_text()
    assert "package-dir" not in text
