"""What a stage runs on, said and recorded: the device, backend, torch / CUDA / driver versions, GPU name and
count (``device_report``), and the check that stops a run before compute when the machine has GPUs this torch
cannot use (``check_gpus_usable``) instead of training on the CPU in silence, and the check of the faiss that
k-means will use against this torch (``check_faiss``).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

import torch

from contrastive.errors import ConfigError


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or Slurm's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity
        return os.cpu_count() or 1


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
        "the CPU: install the torch build for this driver (docs/gpu.md), or update the "
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


# The install lines of docs/gpu.md, named in every faiss message. faiss-cpu and faiss-gpu both install into one
# faiss/ package (whichever installs last wins its files), so an environment holds exactly one of them.
FAISS_CPU_INSTALL = "pip install -e '.[cpu]'"
FAISS_GPU_INSTALL = ("pip install torch==2.14.1 torchvision==0.29.1 --index-url "
                     "https://download.pytorch.org/whl/cu128 && pip install -e '.[gpu]'")
FAISS_DOCS = "docs/gpu.md"


@dataclass(frozen=True)
class FaissWheel:
    """One installed faiss distribution: its name, version and the CUDA major it was built for (None: CPU)."""
    name: str
    version: str
    cuda_major: int | None


def _wheel_cuda_major(dist: importlib.metadata.Distribution) -> int | None:
    """The CUDA major of a faiss wheel: from its name (faiss-gpu-cu12, faiss-gpu-cu13-cuvs), its CUDA runtime
    requirement (nvidia-cuda-runtime-cu12) or its classifier ("Environment :: GPU :: NVIDIA CUDA :: 12"); None for
    faiss-cpu. A GPU wheel that says none of these counts as CUDA 0 (unknown), never as a CPU build."""
    name = dist.metadata["Name"].lower().replace("_", "-")
    if not name.startswith("faiss-gpu"):
        return None
    texts = [name, *(dist.requires or []), *(dist.metadata.get_all("Classifier") or [])]
    for pattern in (r"-cu(\d+)", r"nvidia-cuda-runtime-cu(\d+)", r"NVIDIA CUDA :: (\d+)"):
        for text in texts:
            if (found := re.search(pattern, text)):
                return int(found.group(1))
    return 0


def installed_faiss() -> list[FaissWheel]:
    """The faiss distributions installed here (faiss-cpu, faiss-gpu, faiss-gpu-cuNN[-cuvs]), read from their
    metadata without importing faiss (seconds, and a broken mix may not import at all)."""
    wheels = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "faiss-cpu" or name.startswith("faiss-gpu"):
            wheels[name] = FaissWheel(name=name, version=dist.version, cuda_major=_wheel_cuda_major(dist))
    return sorted(wheels.values(), key=lambda wheel: wheel.name)


def _cuda_major(version: str | None) -> int | None:
    return int(version.split(".")[0]) if version else None


def check_faiss(device: str, *, inform: Callable[[str], None] | None = None) -> None:
    """The faiss that k-means will use is consistent with this torch, checked where the pipeline starts.

    ConfigError (with the install line) when: no faiss is installed; two faiss wheels share the faiss/ package;
    a run on the GPU (``device`` auto or cuda) has a faiss-gpu built for another CUDA major than torch (the faiss
    wheels support only their own CUDA runtime in the process). A line through ``inform`` when a GPU run has the
    CPU-only faiss: k-means then runs on the GPU through torch (``contrastive.mcl.lloyd_torch``, faiss's Lloyd on
    torch's matrix product). A faiss without pip metadata (conda) passes.
    """
    inform = inform or logging.getLogger(__name__).info
    wheels = installed_faiss()
    if not wheels:
        if importlib.util.find_spec("faiss") is not None:
            return  # faiss from conda or a source build: no wheel metadata to check
        raise ConfigError(f"faiss is not installed and k-means needs it: install it with {FAISS_CPU_INSTALL} "
                          f"(CPU), or {FAISS_GPU_INSTALL} (GPU k-means; {FAISS_DOCS})")
    if len(wheels) > 1:
        names = " and ".join(f"{wheel.name} {wheel.version}" for wheel in wheels)
        raise ConfigError(
            f"{names} are installed into the same faiss/ package (whichever installed last owns its files; "
            f"uninstalling one breaks the other): keep one: pip uninstall -y {' '.join(w.name for w in wheels)}, "
            f"then {FAISS_CPU_INSTALL} (CPU) or {FAISS_GPU_INSTALL} (GPU k-means; {FAISS_DOCS})")
    wheel = wheels[0]
    on_gpu = device != "cpu" and torch.cuda.is_available()
    torch_cuda = _cuda_major(torch.version.cuda)
    if on_gpu and wheel.cuda_major is not None and wheel.cuda_major != torch_cuda:
        built = f"CUDA {wheel.cuda_major}" if wheel.cuda_major else "an unknown CUDA"
        raise ConfigError(
            f"{wheel.name} {wheel.version} is built for {built} but this torch {torch.__version__} for CUDA "
            f"{torch.version.cuda}; the faiss wheels do not support another CUDA runtime in the process: install "
            f"the matching pair ({FAISS_GPU_INSTALL}), or keep this torch with pip uninstall -y {wheel.name} && "
            f"{FAISS_CPU_INSTALL} (k-means on the CPU), or set device=cpu ({FAISS_DOCS})")
    if on_gpu and wheel.cuda_major is None:
        inform(f"{wheel.name} {wheel.version} is CPU-only, so k-means runs on the GPU through torch (the same "
               f"Lloyd iterations as faiss; faiss-gpu is used instead where installed: {FAISS_GPU_INSTALL}, "
               f"{FAISS_DOCS})")
