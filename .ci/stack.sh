#!/usr/bin/env bash
# The team stack of docker-compose.yml without Docker, on this machine: PostgreSQL (.ci/setup-postgres.sh), an MLflow
# server on PostgreSQL with a local artifact root, and a Prefect server on PostgreSQL. Idempotent.
#   bash .ci/stack.sh start   # `make stack`; prints the two variables that point mclpipe at the stack
#   bash .ci/stack.sh stop    # `make stack-stop` (PostgreSQL keeps running; its data stays in $MCLPIPE_PG_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${MCLPIPE_STACK_DIR:-$PWD/.stack}
MLFLOW_PORT=${MCLPIPE_MLFLOW_PORT:-5000}
PREFECT_PORT=${MCLPIPE_PREFECT_PORT:-4200}
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

case ${1:-start} in
  start)
    bash .ci/setup-postgres.sh
    mkdir -p "$STACK"
    if ! running mlflow; then
      nohup "$BIN/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 \
        --backend-store-uri "postgresql+psycopg2://$PG/mlflow" --artifacts-destination "$STACK/mlartifacts" \
        >"$STACK/mlflow.log" 2>&1 &
      echo $! >"$STACK/mlflow.pid"
    fi
    if ! running prefect; then
      PREFECT_HOME="$STACK/prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false \
        PREFECT_API_DATABASE_CONNECTION_URL="postgresql+asyncpg://$PG/prefect" \
        PREFECT_UI_API_URL="http://127.0.0.1:$PREFECT_PORT/api" PREFECT_UI_URL="http://127.0.0.1:$PREFECT_PORT" \
        nohup "$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT" >"$STACK/prefect.log" 2>&1 &
      echo $! >"$STACK/prefect.pid"
    fi
    wait_for "http://127.0.0.1:$MLFLOW_PORT/health" "the MLflow server" "$STACK/mlflow.log"
    wait_for "http://127.0.0.1:$PREFECT_PORT/api/health" "the Prefect server" "$STACK/prefect.log"
    echo "MLflow  http://127.0.0.1:$MLFLOW_PORT   Prefect  http://127.0.0.1:$PREFECT_PORT"
    echo "point mclpipe at it:"
    echo "  export MLFLOW_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT PREFECT_API_URL=http://127.0.0.1:$PREFECT_PORT/api"
    ;;
  stop)
    for name in mlflow prefect; do
      if running "$name"; then
        kill "$(cat "$STACK/$name.pid")" && rm -f "$STACK/$name.pid"
      fi
    done
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
