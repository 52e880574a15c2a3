"""make gpu-bundle (bench/gpu_bundle.py): which distributions a GPU machine without network is carried, and
bench/on_device.sh's refusals. Building the archive itself downloads ~60 MB: it runs by hand (docs/gpu.md)."""
from __future__ import annotations

import importlib.metadata as metadata
import subprocess
from pathlib import Path

import pytest

from bench import gpu_bundle

ROOT = Path(__file__).resolve().parents[2]


class FakeDistribution:
    def __init__(self, version: str, requires: list[str]):
        self.version, self.requires = version, requires


def fake_metadata(monkeypatch, distributions: dict[str, FakeDistribution]) -> None:
    def distribution(name: str):
        try:
            return distributions[name.lower().replace("_", "-")]
        except KeyError:
            raise metadata.PackageNotFoundError(name) from None
    monkeypatch.setattr(gpu_bundle.metadata, "distribution", distribution)


def test_the_closure_follows_markers_for_the_target_python_and_extras_as_dependents_ask_for_them(monkeypatch):
    fake_metadata(monkeypatch, {
        "app": FakeDistribution("1.0", ['server[fast]>=2', 'backport ; python_version < "3.12"',
                                        'winonly ; sys_platform == "win32"', 'kmeans ; extra == "cpu"',
                                        'gpukmeans ; extra == "gpu"']),
        "server": FakeDistribution("2.1", ['uvloop ; extra == "fast"', 'docs-tool ; extra == "docs"', 'redis-ish']),
        "uvloop": FakeDistribution("0.21", []),
        "redis-ish": FakeDistribution("0.1.7", []),
        "kmeans": FakeDistribution("1.15", ['numpy']),
        "numpy": FakeDistribution("2.4", []),
        "backport": FakeDistribution("9", []),
    })
    closure = gpu_bundle.dependency_closure("app", extras=("cpu",), python_version="3.12")
    # backport is for older Pythons, winonly for Windows, gpukmeans and docs-tool for extras nobody asked for
    assert closure == {"app": "1.0", "server": "2.1", "uvloop": "0.21", "redis-ish": "0.1.7", "kmeans": "1.15",
                       "numpy": "2.4"}
    assert "backport" in gpu_bundle.dependency_closure("app", extras=(), python_version="3.11")


def test_what_the_image_provides_is_left_out_with_what_only_it_needs(monkeypatch):
    fake_metadata(monkeypatch, {
        "mclpipe": FakeDistribution("0.1", ["torch==2.14.1", "prefect==3.8.8", "nvidia-nccl-cu13"]),
        "torch": FakeDistribution("2.14.1", ["sympy>=1.13", "filelock"]),
        "prefect": FakeDistribution("3.8.8", ["filelock"]),
        "filelock": FakeDistribution("3.20", []),
    })
    # sympy is torch's alone (the image's torch brings its own); filelock is prefect's too, so it is carried;
    # nvidia-* is a prefix of the image's; the project travels as its tree
    assert gpu_bundle.carried(python_version="3.12") == {"prefect": "3.8.8", "filelock": "3.20"}


def test_a_needed_distribution_that_is_not_installed_says_to_install_first(monkeypatch):
    fake_metadata(monkeypatch, {"app": FakeDistribution("1.0", ["missing-thing"])})
    with pytest.raises(RuntimeError, match="missing-thing is needed .*make install"):
        gpu_bundle.dependency_closure("app", extras=(), python_version="3.12")


def test_this_projects_bundle_carries_the_prefect_servers_own_dependencies_and_not_torchs():
    """The real closure of this environment: what the 2026-11-28 GPU run lacked (burner-redis, imported by the
    temporary Prefect server's process alone) is in it; torch, its CUDA libraries and sympy (torch's) are not."""
    pins = gpu_bundle.carried(python_version="3.12")
    assert {"prefect", "mlflow", "open-clip-torch", "webdataset", "faiss-cpu", "simplejpeg",
            "burner-redis"} <= set(pins)
    assert not {"torch", "torchvision", "triton", "numpy", "sympy", "mclpipe"} & set(pins)
    assert not [name for name in pins if name.startswith("nvidia-")]
    assert pins["prefect"] == "3.8.8"


def run_on_device(tmp_path: Path, *args: str, bundle: str | None = None) -> subprocess.CompletedProcess:
    work = tmp_path / "tree"
    (work / "bench").mkdir(parents=True)
    (work / "bench" / "on_device.sh").write_bytes((ROOT / "bench" / "on_device.sh").read_bytes())
    if bundle:
        (work / ".whl").mkdir()
        (work / ".whl" / bundle).write_bytes(b"not an archive")
    return subprocess.run(["bash", "bench/on_device.sh", *args], cwd=work, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")})


def test_on_device_refuses_without_a_bundle_and_names_make_gpu_bundle(tmp_path):
    done = run_on_device(tmp_path, "clip,export")
    assert done.returncode == 2
    assert "no .whl/site-py*.tar.xz here: run make gpu-bundle" in done.stdout


def test_on_device_refuses_a_bundle_built_for_another_python(tmp_path):
    done = run_on_device(tmp_path, "clip", bundle="site-py39.tar.xz")
    assert done.returncode == 2
    assert "is for Python 3.9" in done.stdout and "--python-version" in done.stdout


@pytest.mark.parametrize("args", [("clip;rm -rf /",), ("clip", "ten")])
def test_on_device_refuses_rows_or_seconds_that_are_not_plain(tmp_path, args):
    done = run_on_device(tmp_path, *args)
    assert done.returncode == 2 and "on_device.sh:" in done.stdout


@pytest.mark.parametrize("no_verify", [False, True])
def test_the_bundle_is_verified_under_the_target_python_unless_no_verify_says_the_next_step_repeats_it(
        tmp_path, monkeypatch, capsys, no_verify):
    verified = []
    monkeypatch.setattr(gpu_bundle, "carried", lambda python_version: {"app": "1.0"})
    monkeypatch.setattr(gpu_bundle, "build_site", lambda pins, *, site, python_version, wheels: site.mkdir())
    monkeypatch.setattr(gpu_bundle, "verify", lambda site, *, python: verified.append(python) or ["no server"])
    monkeypatch.setattr(gpu_bundle, "pack", lambda site, out: out.write_bytes(b"x") or 1)
    out = tmp_path / "site-py312.tar.xz"
    code = gpu_bundle.main(["--out", str(out), "--python", "/usr/bin/python3.12", *(["--no-verify"] * no_verify)])
    printed = capsys.readouterr().out
    if no_verify:
        assert (code, verified, out.exists()) == (0, [], True) and "not verified here (--no-verify)" in printed
    else:  # the verify ran, under the named interpreter, and its failure stops the build before the archive
        assert (code, verified, out.exists()) == (1, ["/usr/bin/python3.12"], False)
        assert "make gpu-bundle: no server" in printed
