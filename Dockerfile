# mclpipe on a CUDA runtime: GPU training inside; runs as a non-root user.
# The base's CUDA (13.0) is the pinned torch==2.14.1's build from PyPI (torch.version.cuda 13.0; driver R580+).
# k-means runs on faiss-cpu here: PyPI's one CUDA 13 faiss-gpu wheel (faiss-gpu-cu13-cuvs 1.15.0) pins CUDA
# libraries that conflict with torch 2.14.1's (checked 2026-11-25), and a CUDA 12 faiss-gpu beside CUDA 13 torch
# is unsupported; the CUDA 12 pair for GPU k-means: docs/gpu.md.
# Build:  docker build -t mclpipe .
# Run:    docker run --gpus all --ipc=host -v $PWD/runs:/home/mcl/app/runs mclpipe run trifeature_mcl
#         (--ipc=host, or --shm-size=16g: DataLoader workers hand batches over in /dev/shm and NCCL's intra-node
#         transport lives there; Docker's 64 MB default makes workers die with "bus error" or NCCL hang)
FROM nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential make git \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 mcl
USER mcl
WORKDIR /home/mcl/app

COPY --chown=mcl:mcl pyproject.toml README.md ./
COPY --chown=mcl:mcl contrastive ./contrastive
COPY --chown=mcl:mcl launchers ./launchers
COPY --chown=mcl:mcl pipeline_config ./pipeline_config
COPY --chown=mcl:mcl tasks ./tasks
COPY --chown=mcl:mcl flows ./flows

# The dependency set is pinned in pyproject.toml (torch, torchvision, prefect, fastapi < 0.155, mlflow 3.17); the
# install line is docs/gpu.md's for the PyPI torch (CUDA 13): one faiss wheel, faiss-cpu (checked at start-up).
RUN python3 -m venv /home/mcl/venv \
 && /home/mcl/venv/bin/pip install --upgrade pip \
 && /home/mcl/venv/bin/pip install '.[cpu]'

ENV PATH=/home/mcl/venv/bin:$PATH
ENTRYPOINT ["mclpipe"]
CMD ["--help"]
