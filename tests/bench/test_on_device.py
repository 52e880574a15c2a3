"""bench/on_device.sh end to end on the CPU, as a lent GPU machine runs it (issue 52): a bundle built by
`make gpu-bundle` into a scratch directory, the working tree as the machine receives it, a Python other than the
project's venv that holds only what the machine's image holds (its own torch and scientific stack, none of
mclpipe's other dependencies), no network, the rows' dry run at toy sizes under the script's own time limit. What
would stop the script there (a module the bundle lacks, a path, a limit too short to write the report) stops it
here.

The image's Python is a venv of the machine's version (3.12) made from pyenv's interpreter, without system site
packages (it sees neither the project's venv nor the system's), with :data:`IMAGE_PACKAGES` at the versions this
environment runs (the lent image brings CUDA torch 2.14.1: the PyPI wheel, which runs on a CPU too). It is built
once into ``~/.cache/mclpipe`` (about 3 GB downloaded from PyPI, minutes) and reused while its versions match."""
from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from bench import gpu_bundle, gpu_check
from tests.components import missing

ROOT = Path(__file__).resolve().parents[2]
PYTHON_VERSION = "3.12"  # the lent machine's (docs/gpu.md)
#: What the lent machine's image provides (bench/gpu_bundle.py FROM_THE_IMAGE, less the CUDA libraries torch's
#: wheel brings and pip / setuptools, which any venv has).
IMAGE_PACKAGES = ("torch", "torchvision", "numpy", "scipy", "pandas", "pyarrow", "scikit-learn", "matplotlib",
                  "pillow")
IMAGE_DIR = Path.home() / ".cache" / "mclpipe" / f"py{PYTHON_VERSION.replace('.', '')}-image"
#: The rows of the next GPU session's commands (BENCHMARKS.md) that run in minutes here; table4 is the pipeline
#: row's code path with another preset (its dry run alone takes ~7 min: tests/bench/test_gpu_check.py).
ROWS = "pipeline,clip,export"
LIMIT_S = 900


def image_python() -> Path:
    """The image's python3: :data:`IMAGE_DIR`'s venv, made (or remade) when its package versions are not this
    environment's."""
    pins = {name: metadata.version(name) for name in IMAGE_PACKAGES}
    marker = IMAGE_DIR / "mclpipe-image.json"
    python = IMAGE_DIR / "bin" / "python3"
    if python.exists() and marker.is_file() and json.loads(marker.read_text()) == pins:
        return python
    interpreter = gpu_bundle.local_python(PYTHON_VERSION)
    if interpreter is None:
        missing(f"no python{PYTHON_VERSION} here", fix=f"pyenv install {PYTHON_VERSION}")
    shutil.rmtree(IMAGE_DIR, ignore_errors=True)
    subprocess.run([interpreter, "-m", "venv", str(IMAGE_DIR)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *(f"{name}=={version}" for name, version in pins.items())], check=True)
    marker.write_text(json.dumps(pins))
    return python


def working_tree(target: Path) -> None:
    """The files a lent machine receives: tracked ones and untracked ones git does not ignore, as they are now."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in names)):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_on_device_runs_the_gpu_sessions_rows_from_a_fresh_bundle_under_the_image_s_python_offline(tmp_path, request):
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode != 0:
        missing("unshare -n cannot make a network namespace here", fix="run as root (util-linux's unshare)")
    python = image_python()
    # -o: the install stamp taken as it is (a test builds the bundle, it does not reinstall the venv). --no-verify:
    # the dry run below starts the bundle's Prefect server and MLflow store under the same Python (a minute saved)
    built = subprocess.run(["make", "-o", ".venv/.installed", "gpu-bundle",
                            f"ARGS=--out {tmp_path / 'site-py312.tar.xz'} --no-verify"], cwd=ROOT, capture_output=True,
                           text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    tree, out = tmp_path / "tree", tmp_path / "out"
    working_tree(tree)
    (tree / ".whl").mkdir()
    shutil.move(tmp_path / "site-py312.tar.xz", tree / ".whl" / "site-py312.tar.xz")
    # a short TMPDIR, as a machine's /tmp: the data workers' forkserver socket lives under it, and tmp_path under
    # xdist leaves no room for its 32 characters (contrastive/data/workers.py LONGEST_SOCKET_TMPDIR)
    scratch = Path(tempfile.mkdtemp(prefix="on-device-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    # No proxy variables (a lent machine has none, and httpx would send the flow's calls to its own local Prefect
    # server through one): unshare -n leaves loopback alone. The temporary Prefect server's first start compiles
    # the bundle's modules, which took minutes here at load 18 (2026-11-28), past the CLI's 120 s.
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(out), "TMPDIR": str(scratch),
           "DRY": "1", "LANG": "C.UTF-8", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600"}
    done = subprocess.run(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec bash bench/on_device.sh "$0" "$1"',
                           ROWS, str(LIMIT_S)], cwd=tree, env=env, capture_output=True, text=True)
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").exists() else ""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:] + log[-6000:]
    assert "rows ran on the CPU and the GPU sizes check out" in log
    assert f"Python {PYTHON_VERSION}" not in done.stdout  # the bundle was for this python3: no refusal
    section = (out / "BENCHMARKS.md").read_text().split(gpu_check.MARK_BEGIN, 1)[1].split(gpu_check.MARK_END, 1)[0]
    rows = {cells[0]: cells for cells in map(gpu_check._cells, section.splitlines()) if cells and
            cells[0] in ROWS.split(",")}
    assert sorted(rows) == sorted(ROWS.split(","))
    assert all(cells[1].endswith("CPU (dry run, toy sizes)") and cells[3] == "ok" for cells in rows.values()), rows
    assert not os.path.exists(tree / "gpu-check-out")  # the report went to $OUT, as there
