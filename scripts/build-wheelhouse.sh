#!/usr/bin/env bash
# The image's Python packages as wheels, for a build that cannot reach the package index (an air-gapped site, or
# this machine, where pip inside `docker build` may not reach PyPI): every dependency of '.[cpu,stack]' at the
# version the host's venv has (so the container trains with the same torch as the host), into wheelhouse/
# (git-ignored), with requirements.txt naming each wheel's exact version. The Dockerfile mounts the folder during
# its install and keeps no copy in the image. Idempotent: done again only when the venv's versions changed; the
# wheels already there are reused.
#   bash scripts/build-wheelhouse.sh            # then: make image WHEELHOUSE=1
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/pip}
OUT=wheelhouse
EXTRAS=${EXTRAS:-cpu,stack}
if [ ! -x "$PIP" ]; then
  echo "build-wheelhouse: $PIP not found: run 'make install' first (the wheels follow its venv's versions)" >&2
  exit 2
fi
# pip resolves for the image's interpreter: Debian bookworm's python3 (3.11.2), which differs from a venv's newer
# 3.11 in environment markers (redis needs async-timeout below 3.11.3). A Debian bookworm host has it; elsewhere
# IMAGE_PYTHON names a python3.11 of the same patch release.
IMAGE_PYTHON=${IMAGE_PYTHON:-/usr/bin/python3}
if [ "$("$IMAGE_PYTHON" -c 'import sys; print(sys.version_info[:3])' 2>/dev/null)" != "(3, 11, 2)" ]; then
  echo "build-wheelhouse: $IMAGE_PYTHON is not Python 3.11.2 (the image's, Debian bookworm's python3): set" \
       "IMAGE_PYTHON to one, or build with WHEELHOUSE=0 where the image's build reaches PyPI" >&2
  exit 2
fi
# the venv's exact versions as constraints (the editable mclpipe and direct-URL installs left out); kept beside the
# wheels but out of the build context (.dockerignore), so a version the image does not install changes no layer
wanted=$("$PIP" freeze --exclude-editable | grep -v ' @ '; echo "# extras: $EXTRAS, for $IMAGE_PYTHON")
if [ -f "$OUT/requirements.txt" ] && [ "$wanted" = "$(cat "$OUT/constraints.txt" 2>/dev/null)" ]; then
  echo "build-wheelhouse: $OUT/ already holds these versions" >&2
  exit 0
fi
NEW=$OUT.new
rm -rf "$NEW" && mkdir -p "$NEW" "$OUT"
echo "$wanted" > "$NEW/constraints.txt"
# into a new folder, reusing the old one's wheels, so no wheel of an earlier version is left behind (without the
# lines of this machine's pip configuration about its local mirrors' missing folders)
"$PIP" --python "$IMAGE_PYTHON" wheel -q --wheel-dir "$NEW" --find-links "$OUT" -c "$NEW/constraints.txt" \
  ".[$EXTRAS]" 2>&1 | sed "/^WARNING: Location '.*' is ignored/d"
rm -f "$NEW"/mclpipe-*.whl  # the image installs the project from its own source, never a stale wheel
ls "$NEW" | sed -n 's/^\([^-]*\)-\([^-]*\)-.*\.whl$/\1==\2/p' > "$NEW/requirements.txt"
# the build backend pyproject.toml names, for the image's install of the project without the index
"$PIP" download -q --no-deps --dest "$NEW" --find-links "$OUT" \
  "$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"][0])')" \
  2>&1 | sed "/^WARNING: Location '.*' is ignored/d"
rm -rf "$OUT" && mv "$NEW" "$OUT"
echo "build-wheelhouse: $(wc -l < "$OUT/requirements.txt") packages, $(du -sh "$OUT" | cut -f1) in $OUT/" >&2
