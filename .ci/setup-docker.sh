#!/usr/bin/env bash
# A Docker engine for the container tests (tests/e2e/test_container.py, test_compose_stack.py) and `make image`:
# Debian's docker.io (dockerd 20.10, BuildKit built in), docker-compose and debootstrap (the base image where no
# registry can be reached: scripts/make-base-image.sh). Idempotent: installs what is missing and starts dockerd in
# the background (no systemd; its log in $MCLPIPE_DOCKERD_LOG) only when no engine answers.
#   bash .ci/setup-docker.sh         # install, start
#   bash .ci/setup-docker.sh stop    # stop the dockerd this script started (its containers with it); no other
set -euo pipefail
LOG=${MCLPIPE_DOCKERD_LOG:-/tmp/mclpipe-dockerd.log}
PIDFILE=/run/mclpipe-dockerd.pid  # written only by this script: `stop` never touches an engine someone else runs
DOCKER=/usr/bin/docker            # Debian's client (a client of another install may come first on PATH)

if [ "${1:-}" = stop ]; then
  pid=$(cat "$PIDFILE" 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
    # the containers first, each given 10 s (docker stop's default), then the engine with its containerd
    ids=$("$DOCKER" ps -q 2>/dev/null || true)
    [ -z "$ids" ] || "$DOCKER" stop $ids >/dev/null 2>&1 || true
    kill "$pid"
    for _ in $(seq 1 100); do [ -e "/proc/$pid" ] || break; sleep 0.2; done
    [ ! -e "/proc/$pid" ] || { echo "setup-docker: dockerd $pid did not stop in 20 s: kill -9 $pid" >&2; exit 1; }
    echo "setup-docker: stopped dockerd $pid" >&2
  fi
  rm -f "$PIDFILE"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "setup-docker: must run as root (it installs Debian's docker.io and starts dockerd): sudo bash $0" >&2
  exit 1
fi
if [ ! -x /usr/sbin/dockerd ] || [ ! -x "$DOCKER" ] || ! command -v docker-compose >/dev/null \
   || ! command -v debootstrap >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker.io docker-compose debootstrap >/dev/null
fi

if ! "$DOCKER" info >/dev/null 2>&1; then
  # its own session: it outlives this script and is not in the caller's process group
  setsid /usr/sbin/dockerd >"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 150); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 0.2; done
  if ! "$DOCKER" info >/dev/null 2>&1; then
    echo "setup-docker: dockerd did not answer within 30 s; its log: $LOG" >&2
    tail -20 "$LOG" >&2
    exit 1
  fi
fi
echo "setup-docker: $("$DOCKER" version -f 'engine {{.Server.Version}}, {{.Server.Os}}/{{.Server.Arch}}')," \
     "$(df -h --output=avail /var/lib/docker | tail -1 | tr -d ' ') free for images" >&2
