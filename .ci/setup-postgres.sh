#!/usr/bin/env bash
# A PostgreSQL server for the team stack (Prefect + MLflow on PostgreSQL) without Docker. Idempotent: installs
# Debian's postgresql when missing, creates a cluster in $MCLPIPE_PG_DIR on first use, starts it if it is not
# running, and creates the role and the databases (Prefect's, MLflow's and its basic-auth app's) when missing. Listens on 127.0.0.1:$MCLPIPE_PG_PORT only.
#   bash .ci/setup-postgres.sh      # then: postgresql://mclpipe:mclpipe@127.0.0.1:55432/{prefect,mlflow,mlflow_auth}
set -euo pipefail
PG_DIR=${MCLPIPE_PG_DIR:-/tmp/mclpipe-postgres}
PG_PORT=${MCLPIPE_PG_PORT:-55432}
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
# initdb and the server refuse to run as root: run them as the postgres user Debian's package created.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# One setup at a time (make test-slow's pytest-xdist processes may call it together): a lock on the cluster's
# directory, released when this script exits. The server must not inherit it (`9<&-` below): a postgres holding
# the lock for its whole life blocked every later setup (the slow suite's stack tests waited until their timeout).
mkdir -p "$PG_DIR"
exec 9<"$PG_DIR"
if ! flock -w 10 9; then
  # A server an earlier version of this script started holds it: stop it (its databases stay; it starts below).
  pid=$(head -1 "$PG_DIR/data/postmaster.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/fd/9" 2>/dev/null)" = "$(cd "$PG_DIR" && pwd -P)" ]; then
    echo "setup-postgres: restarting the PostgreSQL in $PG_DIR, which held this script's lock" >&2
    as_pg "$(pg_bin)/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null 9<&-
  fi
  if ! flock -w 300 9; then
    echo "setup-postgres: $PG_DIR stayed locked for 300 s, by: $(fuser "$PG_DIR" 2>&1 | tr -s ' '). Stop that" \
         "process (a PostgreSQL: pg_ctl -D $PG_DIR/data stop) and retry" >&2
    exit 3
  fi
fi

if [ -z "$(pg_bin)" ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
  else
    echo "PostgreSQL is not installed: run 'sudo apt-get install -y postgresql' (Debian) and retry" >&2
    exit 2
  fi
fi
BIN=$(pg_bin)

[ "$(id -u)" = 0 ] && chown postgres:postgres "$PG_DIR"
if [ ! -f "$PG_DIR/data/PG_VERSION" ]; then
  as_pg "$BIN/initdb" -D "$PG_DIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
fi
if ! as_pg "$BIN/pg_ctl" -D "$PG_DIR/data" status >/dev/null 2>&1; then
  as_pg "$BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
    -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $PG_DIR" start >/dev/null 9<&-
fi

psql_pg() { as_pg "$BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -tAq "$@"; }
if [ "$(psql_pg -c "SELECT 1 FROM pg_roles WHERE rolname='mclpipe'")" != 1 ]; then
  psql_pg -c "CREATE ROLE mclpipe LOGIN PASSWORD 'mclpipe'"
fi
for db in prefect mlflow mlflow_auth; do
  if [ "$(psql_pg -c "SELECT 1 FROM pg_database WHERE datname='$db'")" != 1 ]; then
    psql_pg -c "CREATE DATABASE $db OWNER mclpipe"
  fi
done
echo "postgresql://mclpipe:mclpipe@127.0.0.1:$PG_PORT/{prefect,mlflow,mlflow_auth} (data in $PG_DIR)"
# The MLflow server's PostgreSQL driver and its basic-auth app's Flask-WTF (the `stack` extra) in the project's
# venv, when there is one.
VENV_PIP="$(cd "$(dirname "$0")/.." && pwd)/${VENV:-.venv}/bin/pip"
if [ -x "$VENV_PIP" ] && ! "${VENV_PIP%pip}python" -c "import psycopg2, flask_wtf" 2>/dev/null; then
  "$VENV_PIP" install -q "psycopg2-binary>=2.9" "mlflow[auth]>=3.17,<3.18"
fi
