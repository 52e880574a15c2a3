# mclpipe's one image: the pipeline (`mclpipe run`, GPU training), the Prefect worker, and the Prefect and MLflow
# servers of the team stack (docker-compose.yml). Runs as the non-root user mcl (uid 1000).
#
# The base: Debian's python3 (3.11) and nothing of CUDA. PyPI's torch 2.14.1 is a CUDA 13 build that brings its
# CUDA user-space libraries as nvidia-* wheels (runtime, cuBLAS, cuDNN, NCCL, cuFFT, cuSPARSE, NVRTC, nvJitLink:
# 3.2 GB under the venv's site-packages/nvidia, beside torch's 1.2 GB and triton's 0.9 GB); torch loads them from
# there (its RUNPATH), never from the system. A GPU run needs only the driver besides them (libcuda.so,
# nvidia-smi), which the NVIDIA container toolkit mounts from the host at `docker run --gpus` and which no image
# may bring. A CUDA runtime base (nvidia/cuda:*-cudnn-runtime) would add a second copy of those libraries that
# nothing here loads; what it gives beyond them is the two NVIDIA_* variables below, without which the toolkit
# mounts only nvidia-smi (capability "utility") and torch sees no GPU. tests/e2e/test_container.py checks it on the
# built image: `ldd` of torch's libtorch_cuda.so finds every library in the venv's nvidia/ but the driver's
# libcuda. Sizes and build times (docker history): BENCHMARKS.md.
#
# k-means runs on faiss-cpu: PyPI's one CUDA 13 faiss-gpu wheel (faiss-gpu-cu13-cuvs 1.15.0) pins CUDA libraries
# that conflict with torch 2.14.1's (checked 2026-11-25); the CUDA 12 pair for GPU k-means: docs/gpu.md.
#
# Build (docs/running.md):  make image                 # BuildKit; BASE and the wheelhouse/ folder below
# Run:  docker run --gpus all --ipc=host -v "$PWD/work:/home/mcl/app" mclpipe:latest run trifeature_mcl
#       (/home/mcl/app is the run root: runs/, data/, mlflow.db; --ipc=host, or --shm-size=16g: DataLoader workers
#       hand batches over in /dev/shm and NCCL's intra-node transport lives there; Docker's 64 MB default makes
#       workers die with "bus error" or NCCL hang). `docker stop -t 30` leaves time for the checkpoint and the
#       one-line resume command.
#
# BASE: a Debian bookworm (python3 3.11). Where the registry cannot be reached, scripts/make-base-image.sh makes
# local/debian:bookworm from Debian's packages (debootstrap) and `make image BASE=local/debian:bookworm` uses it.
ARG BASE=debian:bookworm-slim
FROM ${BASE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# tini: PID 1 that forwards `docker stop`'s SIGTERM to mclpipe and reaps the Prefect server it spawns
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 --shell /bin/bash mcl

# The dependencies first, in a layer of their own that only a change of wheelhouse/requirements.txt (their exact
# versions) rebuilds: the venv in /opt/mclpipe, owned by root, read-only for mcl. wheelhouse/ is mounted for these
# steps only, never copied into the image: the wheels of scripts/build-wheelhouse.sh (pip never reaches the index),
# or requirements.txt alone (scripts/build-image.sh writes pyproject.toml's dependencies there; pip reads PyPI).
RUN --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    if ls /wheelhouse/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheelhouse; fi \
 && python3 -m venv /opt/mclpipe \
 && /opt/mclpipe/bin/pip install --quiet "$@" -r /wheelhouse/requirements.txt

# every package pyproject.toml's packages.find includes (tests/unit/test_compose.py checks the list)
# the run root and the MLflow server's artifact store, owned by mcl: a named volume mounted there (docker-compose.yml:
# runs/, the artifacts) starts as the image's directory, with its owner
RUN install -d -o mcl -g mcl /home/mcl/app /home/mcl/app/runs /home/mcl/mlartifacts

COPY pyproject.toml README.md /src/
COPY contrastive /src/contrastive
COPY launchers /src/launchers
COPY pipeline_config /src/pipeline_config
COPY tasks /src/tasks
COPY flows /src/flows
COPY planning /src/planning
COPY deploy /src/deploy
# the project itself, not editable (its package data from pyproject.toml, as a user's pip install gets it); then
# the Prefect database template make install writes (each run's temporary server copies it instead of migrating)
RUN --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    if ls /wheelhouse/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheelhouse; fi \
 && /opt/mclpipe/bin/pip install --quiet --no-deps "$@" /src \
 && rm -rf /src/build /src/*.egg-info \
 && /opt/mclpipe/bin/python -m flows.local_server --make-template

# mclpipe after a check that the run root is writable (one line naming the fix for a volume of another uid)
COPY deploy/image-entrypoint.sh /usr/local/bin/mclpipe-entrypoint
# Prefect's server writes its UI's static files at start (into its package by default: read-only here)
ENV PATH=/opt/mclpipe/bin:$PATH \
    PREFECT_SERVER_UI_STATIC_DIRECTORY=/home/mcl/.prefect/ui
USER mcl
WORKDIR /home/mcl/app
ENTRYPOINT ["tini", "--", "mclpipe-entrypoint"]
CMD ["--help"]
