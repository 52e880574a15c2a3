#!/usr/bin/env bash
# The team stack of docker-compose.yml without Docker, on this machine: PostgreSQL (.ci/setup-postgres.sh), an MLflow
# server (its basic-auth app) on PostgreSQL with a local artifact root, and a Prefect server (basic authentication)
# on PostgreSQL, both on 127.0.0.1 only. Secrets come from .env, written with random values when there is none and
# never printed. Idempotent.
#   bash .ci/stack.sh start   # `make stack`; prints how to point mclpipe at the stack
#   bash .ci/stack.sh stop    # `make stack-stop` (PostgreSQL keeps running; its data stays in $MCLPIPE_PG_DIR)
#   bash .ci/stack.sh secrets FILE             # write FILE with random secrets unless it exists (tests/e2e/stack.py)
#   bash .ci/stack.sh auth-config FILE DB_URI  # the basic-auth app's config (deploy/mlflow-basic-auth.ini) on DB_URI
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${MCLPIPE_STACK_DIR:-$PWD/.stack}
ENV_FILE=${MCLPIPE_ENV_FILE:-$PWD/.env}
MLFLOW_PORT=${MCLPIPE_MLFLOW_PORT:-5000}
PREFECT_PORT=${MCLPIPE_PREFECT_PORT:-4200}
# the local cluster of .ci/setup-postgres.sh: trust authentication on 127.0.0.1 only, so this password guards nothing
PG=mclpipe:mclpipe@127.0.0.1:${MCLPIPE_PG_PORT:-55432}
BIN=${VENV:-.venv}/bin

running() { [ -f "$STACK/$1.pid" ] && kill -0 "$(cat "$STACK/$1.pid")" 2>/dev/null; }
wait_for() {  # url, name, log
  for _ in $(seq 1 180); do
    if "$BIN/python" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null; then
      return 0
    fi
    sleep 1
  done
  echo "$2 did not answer at $1 within 180 s; its log: $3" >&2
  exit 1
}

# FILE: the secrets of docker-compose.yml and this stack, random, readable by this user only; a FILE that exists is
# kept (refused while it still holds .env.example's placeholders)
secrets() {
  if [ -f "$1" ]; then
    if grep -q "replace-me" "$1"; then
      echo "$1 still holds placeholders of .env.example: replace each 'replace-me...' value, or delete $1 and rerun" \
        "to get random ones" >&2
      exit 2
    fi
    return 0
  fi
  (umask 077 && "$BIN/python" - "$1" <<'PY'
import secrets, sys
token = lambda: secrets.token_urlsafe(32)
values = {"PREFECT_API_AUTH_STRING": f"mclpipe:{token()}", "MLFLOW_TRACKING_USERNAME": "admin",
          "MLFLOW_TRACKING_PASSWORD": token(), "MLFLOW_FLASK_SERVER_SECRET_KEY": token(),
          "POSTGRES_PASSWORD": token(), "MINIO_ROOT_USER": "mclpipe", "MINIO_ROOT_PASSWORD": token()}
with open(sys.argv[1], "x") as f:
    f.write("# random secrets of the team stack, written by .ci/stack.sh (see .env.example); never commit this file\n")
    f.writelines(f"{key}={value}\n" for key, value in values.items())
PY
  )
  echo "wrote random secrets to $1 (not shown; clients load them with: set -a; . $1; set +a)"
}

# FILE: deploy/mlflow-basic-auth.ini with its users and permissions stored at DB_URI
auth_config() {
  "$BIN/python" - "$1" "$2" <<'PY'
import configparser, sys
config = configparser.ConfigParser()
config.read("deploy/mlflow-basic-auth.ini")
config["mlflow"]["database_uri"] = sys.argv[2]
with open(sys.argv[1], "w") as f:
    config.write(f)
PY
}

# whether the MLflow admin of the auth database has .env's password (a .env written after the first start has not)
check_mlflow_login() {
  if ! "$BIN/python" - "http://127.0.0.1:$MLFLOW_PORT" <<'PY'
import base64, os, sys, urllib.error, urllib.request
user, password = os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]
token = base64.b64encode(f"{user}:{password}".encode()).decode()
request = urllib.request.Request(f"{sys.argv[1]}/api/2.0/mlflow/users/current",
                                 headers={"Authorization": f"Basic {token}"})
try:  # the first request after a start is slow (the auth tables, a password hash) on a busy machine
    urllib.request.urlopen(request, timeout=120)
except urllib.error.HTTPError as e:
    sys.exit(1 if e.code == 401 else 0)
PY
  then
    echo "the MLflow server refuses $MLFLOW_TRACKING_USERNAME with the password in $ENV_FILE: its admin was created" \
      "with an earlier .env; restore that file, or drop the auth database (psql ... -c 'DROP DATABASE mlflow_auth')" \
      "and rerun to start over" >&2
    exit 1
  fi
}

case ${1:-start} in
  secrets) secrets "$2" ;;
  auth-config) auth_config "$2" "$3" ;;
  start)
    bash .ci/setup-postgres.sh
    mkdir -p "$STACK"
    secrets "$ENV_FILE"
    set -a
    # shellcheck source=/dev/null
    . "$ENV_FILE"
    set +a
    auth_config "$STACK/basic_auth.ini" "postgresql+psycopg2://$PG/mlflow_auth"
    if ! running mlflow; then
      MLFLOW_AUTH_CONFIG_PATH="$STACK/basic_auth.ini" MLFLOW_AUTH_ADMIN_USERNAME="$MLFLOW_TRACKING_USERNAME" \
        MLFLOW_AUTH_ADMIN_PASSWORD="$MLFLOW_TRACKING_PASSWORD" \
        nohup "$BIN/mlflow" server --app-name basic-auth --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 \
        --backend-store-uri "postgresql+psycopg2://$PG/mlflow" --artifacts-destination "$STACK/mlartifacts" \
        >"$STACK/mlflow.log" 2>&1 &
      echo $! >"$STACK/mlflow.pid"
    fi
    if ! running prefect; then
      PREFECT_HOME="$STACK/prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false \
        PREFECT_SERVER_API_AUTH_STRING="$PREFECT_API_AUTH_STRING" \
        PREFECT_API_DATABASE_CONNECTION_URL="postgresql+asyncpg://$PG/prefect" \
        PREFECT_UI_API_URL="http://127.0.0.1:$PREFECT_PORT/api" PREFECT_UI_URL="http://127.0.0.1:$PREFECT_PORT" \
        nohup "$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT" >"$STACK/prefect.log" 2>&1 &
      echo $! >"$STACK/prefect.pid"
    fi
    wait_for "http://127.0.0.1:$MLFLOW_PORT/health" "the MLflow server" "$STACK/mlflow.log"
    wait_for "http://127.0.0.1:$PREFECT_PORT/api/health" "the Prefect server" "$STACK/prefect.log"
    check_mlflow_login
    echo "MLflow  http://127.0.0.1:$MLFLOW_PORT   Prefect  http://127.0.0.1:$PREFECT_PORT   (credentials: $ENV_FILE)"
    echo "point mclpipe at it:"
    echo "  set -a; . $ENV_FILE; set +a"
    echo "  export MLFLOW_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT PREFECT_API_URL=http://127.0.0.1:$PREFECT_PORT/api"
    ;;
  stop)
    for name in mlflow prefect; do
      if running "$name"; then
        kill "$(cat "$STACK/$name.pid")" && rm -f "$STACK/$name.pid"
      fi
    done
    ;;
  *) echo "usage: $0 start|stop|secrets FILE|auth-config FILE DB_URI" >&2; exit 2 ;;
esac
