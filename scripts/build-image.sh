#!/usr/bin/env bash
# `make image`: the project's image (Dockerfile) as $IMAGE (default mclpipe:latest), with BuildKit.
#   BASE        the base image (default debian:bookworm-slim). Left unset on a machine that cannot reach the
#               image registry, it is made from Debian's packages (scripts/make-base-image.sh: local/debian:bookworm)
#   WHEELHOUSE  1: the Python packages from wheelhouse/ (scripts/build-wheelhouse.sh, the host venv's versions;
#               pip in the build never reaches the index); 0: from PyPI. Default: 1 where the registry cannot be
#               reached (such a machine's builds may not reach PyPI either), else the wheels wheelhouse/ holds if any
# Prints the build's seconds and the image's size (BENCHMARKS.md takes them from here).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-mclpipe:latest}
# A client that builds with BuildKit (the Dockerfile mounts the wheelhouse, RUN --mount): docker with the buildx
# plugin (Docker 23+), or Debian's docker.io client (20.10, BuildKit built in) where an older-style client without
# buildx comes first on PATH.
DOCKER=${DOCKER:-docker}
if ! "$DOCKER" buildx version >/dev/null 2>&1 && [ -x /usr/bin/docker ] && [ "$DOCKER" = docker ]; then
  DOCKER=/usr/bin/docker
fi
if ! "$DOCKER" info >/dev/null 2>&1; then
  echo "make image: no Docker engine answers ($DOCKER info failed): start one (bash .ci/setup-docker.sh installs and starts Debian's)" >&2
  exit 2
fi
if [ -z "${BASE:-}" ]; then
  BASE=debian:bookworm-slim
  if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1 && ! "$DOCKER" pull -q "$BASE" >/dev/null 2>&1; then
    echo "make image: $BASE cannot be pulled: making the base from Debian's packages (scripts/make-base-image.sh)" >&2
    bash scripts/make-base-image.sh
    BASE=local/debian:bookworm
    WHEELHOUSE=${WHEELHOUSE:-1}
  fi
fi
if [ "${WHEELHOUSE:-}" = 1 ]; then
  bash scripts/build-wheelhouse.sh
elif [ "${WHEELHOUSE:-}" = 0 ] && ls wheelhouse/*.whl >/dev/null 2>&1; then
  echo "make image: WHEELHOUSE=0, but wheelhouse/ holds wheels: remove it (rm -r wheelhouse) to build from PyPI" >&2
  exit 2
elif ! ls wheelhouse/*.whl >/dev/null 2>&1; then
  # from PyPI: the Dockerfile installs wheelhouse/requirements.txt, here pyproject.toml's dependencies and extras
  rm -rf wheelhouse && mkdir wheelhouse
  python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + [r for extra in ("cpu", "stack") for r in p["optional-dependencies"][extra]]))' \
    > wheelhouse/requirements.txt
fi
start=$SECONDS
DOCKER_BUILDKIT=1 "$DOCKER" build --build-arg "BASE=$BASE" -t "$IMAGE" ${DOCKER_BUILD_ARGS:-} .
size=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")
echo "make image: $IMAGE from $BASE in $((SECONDS - start)) s, $((size / 1000000)) MB" >&2
