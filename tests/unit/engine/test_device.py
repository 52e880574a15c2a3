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
    check_gpus_usable("auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_module.shutil, "which", lambda name: None)  # no driver, no tool: a CPU machine
    check_gpus_usable("auto")


def test_the_report_names_device_backend_and_versions():
    report = device_report(torch.device("cpu"), backend=None, world_size=1)
    assert report == {"device": "cpu", "backend": "none", "processes": "1", "torch": torch.__version__}
