#!/usr/bin/env bash
# The image's base where no registry can be reached: Debian bookworm (python3 3.11, as debian:bookworm-slim) made
# from Debian's own packages with debootstrap, imported as local/debian:bookworm (~200 MB). Idempotent: an image
# already there is kept (FORCE=1 makes it again).
#   bash scripts/make-base-image.sh && make image BASE=local/debian:bookworm
set -euo pipefail
TAG=${BASE_TAG:-local/debian:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ -z "${FORCE:-}" ] && docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "make-base-image: $TAG is there" >&2
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  echo "make-base-image: debootstrap is not installed: run 'apt-get install -y debootstrap' (or bash .ci/setup-docker.sh)" >&2
  exit 2
fi
if [ "$(id -u)" != 0 ]; then
  echo "make-base-image: debootstrap needs root (it chroots and creates device files): run it with sudo" >&2
  exit 2
fi
ROOT=$(mktemp -d /tmp/mclpipe-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 \
  || { echo "make-base-image: debootstrap failed (log: $ROOT.log)" >&2; exit 1; }
rm -f "$ROOT.log"
# the security updates too, as debian:bookworm-slim has them; no package lists or caches in the image
cat >"$ROOT/etc/apt/sources.list" <<SOURCES
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
tar -C "$ROOT" -c . | docker import --change 'CMD ["bash"]' - "$TAG" >/dev/null
echo "make-base-image: $TAG, $(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%d MB", $1/1e6}')" >&2
