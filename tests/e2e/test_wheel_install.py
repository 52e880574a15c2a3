"""The release as a user installs it: ``python -m build`` makes an sdist and, from that sdist, a wheel; ``twine
check`` passes both; the wheel holds every file of the packages that git tracks (presets, model configs: what a
non-editable install would miss); installed (not editable) into a fresh venv, ``mclpipe --version`` is
pyproject.toml's and a tiny preset of each modality (made smaller: tests/e2e/small_runs.py) runs from a directory
outside this checkout.

The fresh venv gets mclpipe from the wheel alone (``pip install --no-deps --no-index``) and its dependencies
(torch, Prefect, MLflow...: GBs to copy) through one ``.pth`` line naming this project's .venv site-packages,
written after the install. A plain path line in a ``.pth`` adds that directory to sys.path without running the
``.pth`` files inside it, so .venv's editable hook of this checkout (``__editable__.mclpipe-*.pth``) never runs:
``contrastive``, ``flows`` ... import from the venv's own site-packages, which the test checks, with no PYTHONPATH
and a working directory outside the checkout. That every requirement the wheel declares is met there is checked
too (the .pth makes them visible, not necessarily right).

Time: 13.5 min on the 2-core machine at load average 14 (2026-11-28): build, twine, venv and the Prefect
database template 105 s, the import and version checks 70 s, the runs 284 s (trifeature_tiny), 152 s (clip_tiny),
104 s (text_tiny), 92 s (embeddings_tiny). Its six tests are one xdist group (tests/conftest.py): one build.
"""
import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.components import require_modules
from tests.e2e.small_runs import SMALLER

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: The top-level packages the wheel ships (pyproject.toml's packages.find include patterns, "flows*" -> flows).
PACKAGES = tuple(p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
VERSION = PYPROJECT["project"]["version"]
#: One tiny preset per modality, and a row its results table prints.
TINY_RUNS = {"trifeature_tiny": "MCL concat", "clip_tiny": "stage 0", "text_tiny": "MCL concat",
             "embeddings_tiny": "MCL concat"}
# Run by the fresh venv's python: where mclpipe's packages come from, and each declared requirement's check.
WHERE = """
import importlib, importlib.metadata as md, json, sys
from packaging.requirements import Requirement
unmet = []
for line in md.requires("mclpipe") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra's
    try:
        if not req.specifier.contains(md.version(req.name), prereleases=True):
            unmet.append(f"{line} (found {md.version(req.name)})")
    except md.PackageNotFoundError:
        unmet.append(f"{line} (missing)")
files = {name: importlib.import_module(name).__file__ for name in %r}
print(json.dumps({"files": files, "version": md.version("mclpipe"), "unmet": unmet, "path": sys.path}))
""" % (PACKAGES,)


def _env(tmp: Path) -> dict[str, str]:
    """A user's environment: nothing pointing at this checkout, its own Prefect home and MLflow store."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PREFECT_API_URL")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO)))
    return env | {"PREFECT_HOME": str(tmp / "prefect"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
                  "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "200"}


def _run(args: list, *, cwd: Path, env: dict | None = None, timeout: int = 300) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))}:\n{(done.stdout + done.stderr)[-5000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The sdist and wheel built from this checkout, and a fresh venv holding the wheel: {"venv", "work", ...}."""
    require_modules("build", "twine", fix="pip install -e '.[test]' (build and twine)")
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    # --no-isolation: setuptools from .venv rather than from the index. Without --sdist/--wheel, build makes the
    # sdist and then the wheel from the unpacked sdist, so a file the sdist lacks is missing from the wheel too.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, REPO], cwd=tmp)
    sdist, wheel = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    assert [p.name for p in sdist + wheel] == [f"mclpipe-{VERSION}.tar.gz", f"mclpipe-{VERSION}-py3-none-any.whl"]
    _run([sys.executable, "-m", "twine", "check", "--strict", *sdist, *wheel], cwd=tmp)
    venv, work = tmp / "venv", tmp / "work"
    work.mkdir()
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel[0]],
         cwd=tmp)
    site = Path(_run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp)
                .strip())
    (site / "_mclpipe_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = _env(tmp)
    # What `make install` does after pip: the migrated Prefect database each run's temporary server starts from.
    _run([python, "-m", "flows.local_server", "--make-template"], cwd=work, env=env, timeout=300)
    return {"venv": venv, "site": site, "work": work, "env": env, "wheel": wheel[0], "python": python}


def test_the_wheel_holds_every_tracked_file_of_the_packages(installed):
    """Presets, model configs and every module git tracks under the packages are in the wheel (a file read at run
    time that package-data forgot is missing only from a non-editable install)."""
    tracked = _run(["git", "ls-files", *PACKAGES], cwd=REPO).split()
    in_wheel = set(zipfile.ZipFile(installed["wheel"]).namelist())
    missing = [path for path in tracked if path not in in_wheel]
    assert not missing, f"tracked files missing from the wheel: {missing}"
    assert any(path.startswith("pipeline_config/presets/") for path in in_wheel)


def test_the_fresh_venv_runs_the_wheel_not_the_checkout(installed):
    import json
    where = json.loads(_run([installed["python"], "-I", "-c", WHERE], cwd=installed["work"], env=installed["env"]))
    for name, file in where["files"].items():
        assert Path(file).is_relative_to(installed["site"]), f"{name} imported from {file}, not the wheel"
    assert where["version"] == VERSION and not where["unmet"], where
    mclpipe = installed["venv"] / "bin" / "mclpipe"
    assert _run([mclpipe, "--version"], cwd=installed["work"], env=installed["env"]).strip() == f"mclpipe {VERSION}"
    listed = _run([mclpipe, "presets"], cwd=installed["work"], env=installed["env"]).split()
    assert set(TINY_RUNS) <= set(listed)


@pytest.mark.parametrize("preset", list(TINY_RUNS))
def test_a_tiny_preset_of_each_modality_runs_from_the_wheel(installed, preset):
    """``mclpipe run <preset>`` from a directory outside the checkout: exit 0, its results table, its
    summary.json under that directory, the registered model named."""
    work = installed["work"] / preset
    work.mkdir()
    sets = [arg for value in SMALLER[preset] for arg in ("--set", value)]  # smaller: what the wheel holds is the check
    out = _run([installed["venv"] / "bin" / "mclpipe", "run", preset, *sets], cwd=work, env=installed["env"],
               timeout=580)
    assert TINY_RUNS[preset] in out and f'models:/{preset}@current' in out, out[-3000:]
    assert list((work / "runs" / "pipelines").glob("*/summary.json")), out[-3000:]
