"""What a stage runs on, said and recorded: the device, backend, torch / CUDA / driver versions, GPU name and
count (``device_report``), and the check that stops a run before compute when the machine has GPUs this torch
cannot use (``check_gpus_usable``) instead of training on the CPU in silence.
"""
from __future__ import annotations

import shutil
import subprocess

import torch

from contrastive.errors import ConfigError


def nvidia_smi_gpus() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)"); [] without the tool or a
    driver."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        listed = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in listed.stdout.splitlines() if line.startswith("GPU ")] if listed.returncode == 0 else []


def driver_version() -> str | None:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None


def check_gpus_usable(device: str) -> None:
    """``device`` auto or cuda on a machine whose GPUs torch cannot use (a torch build for a newer driver, no
    kernels for the GPU's architecture): ConfigError naming the mismatch and the fixes, before any compute."""
    if device == "cpu" or torch.cuda.is_available():
        return
    listed = nvidia_smi_gpus()
    if not listed:
        return  # no GPU here: auto means the CPU, and device=cuda says so itself (device_for)
    raise ConfigError(
        f"nvidia-smi lists {len(listed)} GPU(s) ({listed[0].split(' (UUID')[0]}, driver {driver_version()}) but this "
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use them, so device={device} would train on "
        "the CPU: install the torch build for this driver (docs/operating.md, GPU installs), or update the "
        "driver (CUDA 13 builds need R580 or newer); set device=cpu to train on the CPU on purpose")


def device_report(device: torch.device, *, backend: str | None, world_size: int) -> dict[str, str]:
    """Where a stage trained, as MLflow tags and a log line: device, backend, processes, torch, CUDA, driver, GPU
    name and count (the CUDA fields only on a GPU)."""
    report = {"device": str(device), "backend": backend or "none", "processes": str(world_size),
              "torch": torch.__version__}
    if device.type == "cuda":
        report.update({"cuda": str(torch.version.cuda), "driver": str(driver_version()),
                       "gpu": torch.cuda.get_device_name(device), "gpus_visible": str(torch.cuda.device_count())})
    return report
