#!/usr/bin/env bash
# A headless browser for the UI check (`make ui-check`, tests/e2e/test_ui_browser.py). Idempotent: Debian's chromium
# and chromium-driver when missing, and the playwright Python package (the `ui` extra) in the project's venv.
# playwright drives /usr/bin/chromium; `playwright install` (a browser download) is never needed.
set -euo pipefail
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null
  else
    echo "chromium is not installed: run 'sudo apt-get install -y chromium chromium-driver' (Debian) and retry" >&2
    exit 2
  fi
fi
VENV_BIN="$(cd "$(dirname "$0")/.." && pwd)/${VENV:-.venv}/bin"
if [ -x "$VENV_BIN/pip" ] && ! "$VENV_BIN/python" -c "import playwright" 2>/dev/null; then
  "$VENV_BIN/pip" install -q "playwright>=1.40"
fi
/usr/bin/chromium --version
