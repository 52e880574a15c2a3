#!/bin/sh
# The image's entrypoint (Dockerfile): mclpipe in the working directory, the run root (runs/, data/, mlflow.db),
# which is a mounted volume. A volume this user cannot write (a host directory of another uid) ends here in one line
# naming the fix, before Python starts, rather than in a PermissionError's traceback wherever the first write is.
case "${1:-}" in
  ""|-h|--help|--version|--install-completion|--show-completion) ;;
  *)
    if [ ! -w . ]; then
      echo "error: the run root $(pwd) (a mounted volume, owned by uid $(stat -c %u .)) is not writable by this" \
           "container's user, uid $(id -u): on the host, 'chown -R $(id -u) DIR' the directory you mount there," \
           "or run the container with --user $(stat -c %u .)" >&2
      exit 2
    fi
    ;;
esac
exec mclpipe "$@"
