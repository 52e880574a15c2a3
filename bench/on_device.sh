#!/usr/bin/env bash
# `make gpu-check` on a GPU machine without network, from the bundle `make gpu-bundle` built (docs/gpu.md, "A GPU
# machine without network"): unpacks .whl/site-pyXY.tar.xz, checks it was built for this machine's python3, runs
# the rows under a time limit (the report is rewritten after every row, so a stopped run keeps its finished rows)
# and leaves BENCHMARKS.md and the log in $OUT (the lent machine's return folder) or ./gpu-check-out.
#   bash bench/on_device.sh ROWS [SECONDS]      e.g. bash bench/on_device.sh clip,export,input 540
# DRY=1 runs the rows' dry run instead (CPU, toy sizes; tests/bench/test_on_device.py proves the script that way
# under another Python, without network, before a GPU is asked for).
# A file, not a here-document: DataLoader workers start from a forkserver, which re-imports the main module from
# its path (a script read from stdin fails there: the 2026-11-28 run lost a command to it).
set -u
rows=${1:?"which rows, e.g. bash bench/on_device.sh clip,export,input"}
limit=${2:-540}
out=${OUT:-gpu-check-out}
[[ $rows =~ ^[a-z0-9_,]+$ ]] || { echo "on_device.sh: rows '$rows' are not a comma-separated list of row names"; exit 2; }
[[ $limit =~ ^[0-9]+$ ]] || { echo "on_device.sh: seconds '$limit' is not a whole number"; exit 2; }
bundle=$(ls .whl/site-py*.tar.xz 2>/dev/null | head -1)
if [ -z "$bundle" ]; then
  echo "on_device.sh: no .whl/site-py*.tar.xz here: run make gpu-bundle on a machine with network and carry .whl"
  exit 2
fi
built_for=$(basename "$bundle" .tar.xz); built_for=${built_for#site-py}
here=$(python3 -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
if [ "$built_for" != "$here" ]; then
  echo "on_device.sh: $bundle is for Python ${built_for:0:1}.${built_for:1}, this python3 is ${here:0:1}.${here:1}:" \
       "make gpu-bundle ARGS='--python-version ${here:0:1}.${here:1}'"
  exit 2
fi
site=${TMPDIR:-/tmp}/mclpipe-site
mkdir -p "$site" "$out" && tar -C "$site" -xJf "$bundle" || { echo "on_device.sh: could not unpack $bundle"; exit 2; }
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -c 'import torch, torchvision, numpy, PIL; print("torch", torch.__version__, "torchvision", torchvision.__version__,
"numpy", numpy.__version__, "pillow", PIL.__version__, "cores", __import__("os").cpu_count())'
date -u
dry=(); [ "${DRY:-0}" = 1 ] && dry=(--dry-run --report BENCHMARKS.md)
timeout "$limit" python3 -m bench.gpu_check --rows "$rows" "${dry[@]}" > "$out/gpu_check.log" 2>&1
rc=$?
date -u
cp BENCHMARKS.md "$out/"
grep -E "^[a-z0-9_]+: (ok|failed|not measured)" "$out/gpu_check.log" || tail -n 30 "$out/gpu_check.log"
[ $rc -eq 124 ] && echo "on_device.sh: stopped at $limit s; BENCHMARKS.md keeps the rows that finished"
exit $rc
