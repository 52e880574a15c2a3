"""Helpers of the container tests: the Docker engine (.ci/setup-docker.sh), the project's image built once per test
process from this tree (scripts/build-image.sh, `make image`: a layer-cache hit when CI's "make image" phase built
it), and `docker run` of it."""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

from tests.components import missing

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("MCLPIPE_TEST_IMAGE", "mclpipe:latest")
DOCKER_FIX = "bash .ci/setup-docker.sh (Debian's docker.io, started in the background)"
UID = 1000  # the image's user, mcl (Dockerfile)
BUILD_TIMEOUT = 3600  # a cold build on a loaded 2-core machine: ~10 min; with the layer cache, seconds


def docker(*args: str, timeout: float = 600, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check:
        assert done.returncode == 0, f"docker {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done


def require_docker() -> None:
    """Skip (a developer's machine) or fail (CI) where no Docker engine answers."""
    if shutil.which("docker") is None:
        missing("no docker client", fix=DOCKER_FIX)
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        missing("no Docker engine answers", fix=DOCKER_FIX)


@functools.cache
def built_image() -> str:
    """The image of this tree, built once per process with `make image`'s script (BASE and the wheelhouse as it
    chooses them); its tag."""
    require_docker()
    done = subprocess.run(["bash", "scripts/build-image.sh"], cwd=REPO, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT, env={**os.environ, "IMAGE": IMAGE})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return IMAGE


def owned_by_image_user(directory: Path) -> Path:
    """``directory``, created and given to the image's user (as `docker run -v` needs for a non-root container)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, UID, UID)
    return directory


#: Variables that set torch's CPU threads, passed into the container as the host's runs have them: a CPU run's
#: floats depend on the thread count (how a reduction is split), so the container's table equals the host's only with
#: the same one (`make test-slow` sets OMP_NUM_THREADS; a container sees every core otherwise).
THREAD_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def run_in_image(run_root: Path, *args: str, name: str | None = None, detach: bool = False,
                 timeout: float = 1200) -> subprocess.CompletedProcess:
    """`docker run` of the image (its entrypoint, mclpipe) with ``run_root`` as its working directory (runs/,
    data/, mlflow.db) and no network; as the image's non-root user; with this process's torch thread settings
    (:data:`THREAD_SETTINGS`)."""
    options = ["--network", "none", "-v", f"{run_root}:/home/mcl/app"]
    options += [option for name in THREAD_SETTINGS if name in os.environ
                for option in ("-e", f"{name}={os.environ[name]}")]
    if name:
        options += ["--name", name]
    options += ["-d"] if detach else ["--rm"]
    return docker("run", *options, built_image(), *args, timeout=timeout, check=False)


def summary_results(run_root: Path) -> dict:
    """The results table of the one pipeline under ``run_root``/runs (its summary.json)."""
    [summary] = (run_root / "runs" / "pipelines").glob("*/summary.json")
    return json.loads(summary.read_text())["results"]
