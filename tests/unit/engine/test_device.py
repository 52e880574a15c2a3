"""contrastive/engine/device.py: a machine whose GPUs this torch cannot use stops the run before compute with
the mismatch and the fixes named; where a stage trained is reported (device, backend, versions)."""
import subprocess

import pytest
import torch

from contrastive.engine import device as device_module
from contrastive.engine.device import check_gpus_usable, device_report
from contrastive.errors import ConfigError

LISTED = "GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-1234)\nGPU 1: Tesla V100-SXM2-16GB (UUID: GPU-5678)\n"


@pytest.fixture
def nvidia_smi(monkeypatch):
    """An nvidia-smi that lists two V100s and driver 535.54 (what `nvidia-smi -L` and the query print)."""
    def run(args, **kwargs):
        out = LISTED if args[1] == "-L" else "535.54.03\n"
        return subprocess.CompletedProcess(args, 0, stdout=out, stderr="")
    monkeypatch.setattr(device_module.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(device_module.subprocess, "run", run)


def test_gpus_torch_cannot_use_stop_the_run_with_the_fix(nvidia_smi, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("auto", "cuda"):
        with pytest.raises(ConfigError) as stopped:
            check_gpus_usable(device)
        message = str(stopped.value)
        assert "nvidia-smi lists 2 GPU(s) (GPU 0: Tesla V100-SXM2-16GB, driver 535.54.03)" in message
        assert f"this torch {torch.__version__}" in message and "R580" in message and "set device=cpu" in message
    check_gpus_usable("cpu")  # on purpose: no error


def test_no_gpu_or_a_usable_one_passes(monkeypatch, nvidia_smi):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert len(device_module.nvidia_smi_gpus()) == 2  # GPUs listed, and torch can use them
    check_gpus_usable("auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_module.shutil, "which", lambda name: None)  # no driver, no tool: a CPU machine
    assert device_module.nvidia_smi_gpus() == []
    check_gpus_usable("auto")


def test_the_report_names_device_backend_and_versions():
    report = device_report(torch.device("cpu"), backend=None, world_size=1)
    assert report == {"device": "cpu", "backend": "none", "processes": "1", "torch": torch.__version__}


class FakeWheel:
    """An installed distribution as importlib.metadata shows it: Name and Classifier metadata, Requires-Dist."""

    def __init__(self, name: str, version: str = "1.15.1", *, requires=(), classifiers=()):
        from email.message import Message
        self.metadata = Message()
        self.metadata["Name"] = name
        for classifier in classifiers:
            self.metadata["Classifier"] = classifier
        self.version, self.requires = version, list(requires)


CPU_WHEEL = FakeWheel("faiss-cpu")
META_GPU_WHEEL = FakeWheel("faiss-gpu", requires=["numpy>=1.25", "nvidia-cuda-runtime-cu12<13,>=12.6"],
                           classifiers=["Environment :: GPU :: NVIDIA CUDA :: 12"])


@pytest.fixture
def faiss_env(monkeypatch):
    """Install the given fake faiss wheels beside a torch built for ``cuda`` with or without a usable GPU."""
    def install(*wheels, cuda="13.0", gpu=True):
        others = [FakeWheel("numpy", "2.3.0")]
        monkeypatch.setattr(device_module.importlib.metadata, "distributions", lambda: iter([*others, *wheels]))
        monkeypatch.setattr(torch.version, "cuda", cuda)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    return install


def test_the_cuda_major_of_a_faiss_wheel_comes_from_its_name_requirement_or_classifier(faiss_env):
    faiss_env(CPU_WHEEL, META_GPU_WHEEL, FakeWheel("faiss_gpu_cu13_cuvs"), FakeWheel("faiss-gpu-nvidia"))
    assert {w.name: w.cuda_major for w in device_module.installed_faiss()} == {
        "faiss-cpu": None, "faiss-gpu": 12, "faiss-gpu-cu13-cuvs": 13, "faiss-gpu-nvidia": 0}


def test_two_faiss_wheels_in_one_package_stop_the_run_with_the_uninstall(faiss_env):
    faiss_env(CPU_WHEEL, FakeWheel("faiss-gpu-cu12"), cuda="12.8")
    for device in ("cpu", "auto"):
        with pytest.raises(ConfigError, match="faiss-cpu 1.15.1 and faiss-gpu-cu12 1.15.1 are installed into the "
                                              "same faiss/ package") as stopped:
            device_module.check_faiss(device)
        assert "pip uninstall -y faiss-cpu faiss-gpu-cu12" in str(stopped.value)
        assert device_module.FAISS_CPU_INSTALL in str(stopped.value)


def test_faiss_for_another_cuda_than_torch_stops_a_gpu_run(faiss_env):
    faiss_env(META_GPU_WHEEL, cuda="13.0")
    with pytest.raises(ConfigError, match=r"faiss-gpu 1.15.1 is built for CUDA 12 but this torch .* for CUDA 13.0"):
        device_module.check_faiss("auto")
    device_module.check_faiss("cpu")  # k-means on the CPU: faiss-gpu's CPU code needs no CUDA
    faiss_env(META_GPU_WHEEL, cuda="12.8")
    device_module.check_faiss("cuda")  # the matching pair
    faiss_env(FakeWheel("faiss-gpu-cu13-cuvs"), cuda="13.0")
    device_module.check_faiss("cuda")


def test_cpu_faiss_on_a_gpu_run_says_that_kmeans_runs_on_the_gpu_through_torch(faiss_env):
    lines = []
    faiss_env(CPU_WHEEL, cuda="13.0", gpu=True)
    device_module.check_faiss("auto", inform=lines.append)
    assert len(lines) == 1 and "k-means runs on the GPU through torch" in lines[0]
    assert device_module.FAISS_GPU_INSTALL in lines[0]
    faiss_env(CPU_WHEEL, cuda="13.0", gpu=False)
    device_module.check_faiss("auto", inform=lines.append)
    device_module.check_faiss("cpu", inform=lines.append)
    assert len(lines) == 1  # no GPU, or the CPU on purpose: nothing to say


def test_no_faiss_at_all_names_the_install_line(faiss_env, monkeypatch):
    faiss_env()
    monkeypatch.setattr(device_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"faiss is not installed .*pip install -e '\.\[cpu\]'"):
        device_module.check_faiss("auto")
    monkeypatch.setattr(device_module.importlib.util, "find_spec", lambda name: object())  # conda's faiss
    device_module.check_faiss("auto")


def test_this_environment_has_one_consistent_faiss():
    wheels = device_module.installed_faiss()
    assert len(wheels) == 1 and wheels[0].name.startswith("faiss-"), wheels  # make install's one faiss wheel
    device_module.check_faiss("cpu")
