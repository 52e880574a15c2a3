"""`make gpu-bundle`: the Python packages a GPU machine without network needs to run `make gpu-check`, built here
and carried there as one archive (docs/gpu.md, "A GPU machine without network").

Such a machine (a lent GPU, an air-gapped node) brings Python 3.12 and its own CUDA build of torch with the usual
scientific stack, and nothing of mclpipe's own dependencies. The bundle holds every package of mclpipe's
dependency closure (the ``cpu`` extra included: faiss-cpu), at the version this environment installed (the one CI
tests), for that Python and x86-64 Linux, except the ones the machine's image must provide itself:
:data:`FROM_THE_IMAGE` (torch and what is built against it; the large compiled libraries of any CUDA PyTorch image).

The closure is read from the installed distributions' metadata, markers evaluated for the target Python, so a
dependency that only another process imports is carried too: the 2026-11-28 GPU run had picked its wheels by the
modules a local run imported, missed ``burner_redis`` (imported by the temporary Prefect server's process alone)
and lost its ``table4`` row. :func:`verify` then starts the real Prefect server and an MLflow store from the
bundle under a local Python of the target version (``python3.12``), where one is installed.

    python -m bench.gpu_bundle [--python-version 3.12] [--out .whl/site-py312.tar.xz] [--no-verify]

On the GPU machine: ``bash bench/on_device.sh ROWS`` unpacks it and runs ``bench.gpu_check``.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from contrastive.engine.ports import free_port

#: Distributions the GPU machine's image provides: torch and everything built against one torch (a second copy
#: would not match the image's CUDA), and the large compiled libraries any CUDA PyTorch image holds (carrying
#: them would cost tens of MB of the 64 MiB a lent machine takes). Names canonical (PEP 503); a prefix ends in "-".
FROM_THE_IMAGE = ("torch", "torchvision", "triton", "nvidia-", "cuda-", "numpy", "scipy", "pandas", "pyarrow",
                  "scikit-learn", "matplotlib", "pillow", "setuptools", "pip")
#: What a bundle drops from the installed packages: MLflow's web UI build (27 MB) and Prefect's two (17 MB: a GPU run
#: tracks into a local store and a temporary server, nobody browses them there; Prefect's server skips a UI whose
#: files are missing) and the console scripts (their shebangs name this machine's interpreter).
PRUNED = ("mlflow/server/js", "prefect/server/ui", "prefect/server/ui-v2", "bin")
#: xz's preset: -3 packs the closure in about 30 s on 2 cores where -6 takes 70, for a tenth more bytes (56.6
#: against 50.5 MiB before the Prefect UIs were pruned, 52.8 MiB after; 2026-11-29), inside :data:`CARRY_LIMIT`.
XZ_PRESET = "-3"
#: The platform tags pip may take a wheel of, newest first: the lent images run glibc 2.35 or newer.
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
#: A lent machine takes the working tree and the carried paths together up to 64 MiB (the device tool's limit).
CARRY_LIMIT = 64 * 2**20


def marker_environment(python_version: str) -> dict[str, str]:
    """The PEP 508 marker values of CPython ``python_version`` ("3.12") on x86-64 Linux."""
    return {"python_version": python_version, "python_full_version": f"{python_version}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}


def _applies(requirement: Requirement, *, environment: dict[str, str], extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**environment, "extra": extra}) for extra in extras or {""})


def dependency_closure(root: str, *, extras: tuple[str, ...], python_version: str,
                       skip: Callable[[str], bool] = lambda name: False) -> dict[str, str]:
    """``root`` and every distribution it needs with ``extras``, transitively, as installed here: canonical name
    -> installed version. Markers are evaluated for ``python_version`` on x86-64 Linux, each distribution's own
    extras as its dependents ask for them. A distribution ``skip`` names is left out with what only it needs. A
    needed distribution that is not installed raises (install the project first: ``make install``)."""
    environment = marker_environment(python_version)
    found: dict[str, str] = {}
    wanted: list[tuple[str, set[str]]] = [(root, set(extras))]
    asked: dict[str, set[str]] = {}
    while wanted:
        name, with_extras = wanted.pop()
        key = canonicalize_name(name)
        if key in asked and with_extras <= asked[key]:
            continue
        asked[key] = asked.get(key, set()) | with_extras
        if skip(key):  # provided with its own dependencies (the image's torch brings the sympy it was built with)
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise RuntimeError(f"{name} is needed (by the closure of {root}) but not installed here: run `make "
                               "install` first") from None
        found[key] = distribution.version
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if _applies(requirement, environment=environment, extras={"", *asked[key]}):
                wanted.append((requirement.name, set(requirement.extras)))
    return found


def from_the_image(name: str) -> bool:
    """Whether the GPU machine's image provides the distribution ``name`` (canonical): :data:`FROM_THE_IMAGE`."""
    return any(name.startswith(entry) if entry.endswith("-") else name == entry for entry in FROM_THE_IMAGE)


def carried(*, python_version: str, project: str = "mclpipe", extras: tuple[str, ...] = ("cpu",)) -> dict[str, str]:
    """The distributions the bundle carries: ``project``'s closure with ``extras``, less the project itself (its
    tree travels) and what the image provides (with what only that needs)."""
    closure = dependency_closure(project, extras=extras, python_version=python_version, skip=from_the_image)
    return {name: version for name, version in sorted(closure.items()) if name != canonicalize_name(project)}


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"],
                          capture_output=True, text=True)
    if done.returncode != 0:  # pip's own lines (its warnings about this machine's find-links) only when it fails
        raise RuntimeError(f"pip {args[0]} failed:\n{done.stdout}{done.stderr}")


def local_python(version: str) -> str | None:
    """An interpreter of ``version`` here that runs (a pyenv shim on PATH may name one that is not selected)."""
    candidates = [shutil.which(f"python{version}"),
                  *sorted(map(str, Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}")))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


def _target_flags(python_version: str) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in PLATFORMS:
        flags += ["--platform", platform]
    return flags


def build_site(pins: dict[str, str], *, site: Path, python_version: str, wheels: Path) -> None:
    """Download the wheels of ``pins`` for ``python_version`` into ``wheels`` and install them into ``site`` as a
    ``--target`` tree (what PYTHONPATH points at there), then drop :data:`PRUNED`."""
    _pip("download", "--no-deps", *_target_flags(python_version), "-d", str(wheels),
         *(f"{name}=={version}" for name, version in pins.items()))
    _pip("install", "--no-deps", "--no-compile", *_target_flags(python_version), "--target", str(site),
         *(str(path) for path in sorted(wheels.glob("*.whl"))))
    for relative in PRUNED:
        shutil.rmtree(site / relative, ignore_errors=True)


def pack(site: Path, out: Path) -> int:
    """``site`` as an xz tar at ``out`` (``tar -xJf`` unpacks it); returns its size in bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    with open(partial, "wb") as sink:
        tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", XZ_PRESET], stdin=tar.stdout, stdout=sink, check=True)
        if tar.wait() != 0:
            raise RuntimeError(f"tar of {site} failed")
    partial.replace(out)
    return out.stat().st_size


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def verify(site: Path, *, python: str, timeout: float = 300.0) -> list[str]:
    """What the bundle can run without torch, under ``python`` (the target version): the real Prefect server
    started from it until /api/health answers and an MLflow sqlite store created (its migrations); what needs the
    image's numpy or torch is left to the dry run (``make gpu-check DRY=1``). Returns the failures (empty: all
    good). ``timeout``: the server's first start compiles the tree's modules, minutes on a loaded 2-core machine."""
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(site), "PREFECT_HOME": tmp, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PREFECT_UI_ENABLED": "false"}
        port = free_port()
        log = Path(tmp) / "server.log"
        with open(log, "w") as sink:
            server = subprocess.Popen([python, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                       str(port)], env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while not _healthy(f"http://127.0.0.1:{port}/api/health"):
                if server.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text().strip().splitlines()[-5:]
                    failures.append("the Prefect server did not start from the bundle: " + " | ".join(tail))
                    break
                time.sleep(1)
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a loaded machine: its shutdown outlasted the wait
                server.kill()
                server.wait()
        store = f"sqlite:///{tmp}/mlflow.db"
        checks = {"an MLflow store": f"from mlflow.tracking import MlflowClient; "
                                     f"MlflowClient({store!r}).search_experiments()"}
        for what, code in checks.items():
            done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                failures.append(f"{what} failed from the bundle: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return failures


def tracked_tree_bytes() -> int:
    """The bytes of the files git tracks here (the working tree a lent machine is sent besides the carried)."""
    names = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.split(b"\0")
    return sum(os.path.getsize(name) for name in names if name and os.path.isfile(name))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make gpu-bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument("--out", type=Path, default=None, help="default .whl/site-py<version>.tar.xz")
    parser.add_argument("--python", default=None,
                        help="a local interpreter of that version to verify the bundle with (default pythonX.Y)")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the check under that interpreter, where what runs next repeats it (the dry run of "
                             "bench/on_device.sh: DRY=1 runs the pipeline row from the bundle, its Prefect server "
                             "and MLflow store included)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not re.fullmatch(r"3\.\d{1,2}", args.python_version):
        print(f"make gpu-bundle: --python-version {args.python_version!r} is not like 3.12")
        return 2
    out = args.out or Path(".whl") / f"site-py{args.python_version.replace('.', '')}.tar.xz"
    pins = carried(python_version=args.python_version)
    print(f"{len(pins)} distributions to carry (the image provides {', '.join(FROM_THE_IMAGE)})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        build_site(pins, site=site, python_version=args.python_version, wheels=Path(tmp) / "wheels")
        if args.no_verify:
            print("not verified here (--no-verify)")
        elif python := args.python or local_python(args.python_version):
            failures = verify(site, python=python)
            for failure in failures:
                print(f"make gpu-bundle: {failure}")
            if failures:
                return 1
            print(f"verified under {python}: the Prefect server starts and an MLflow store opens from it")
        else:
            print(f"not verified: no python{args.python_version} here (--python names one)")
        size = pack(site, out)
    total = size + tracked_tree_bytes()
    print(f"{out}: {size / 2**20:.1f} MiB; with the tracked tree {total / 2**20:.1f} MiB of the {CARRY_LIMIT >> 20} "
          "MiB a lent machine takes")
    if total > CARRY_LIMIT:
        print("make gpu-bundle: too large to carry: move a large distribution into FROM_THE_IMAGE or PRUNED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
