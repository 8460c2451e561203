"""The package as users install it: a wheel and an sdist, each built from this checkout and
installed into a fresh virtual environment, then used from a folder outside the checkout.

The venv sees the system site packages (torch and the other dependencies are there already:
installing them again would download gigabytes); attnbench itself comes only from the built
file, so a module or a scenario missing from the wheel fails here.
"""
from __future__ import annotations

import os
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


def _install(dist: Path, where: Path) -> Path:
    env_dir = where / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # --no-deps: the dependencies come from the system site packages; --no-build-isolation for
    # the sdist would need setuptools>=68 here, so the sdist builds isolated like a user's does.
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
