#!/bin/sh
# The compose demo's one-shot `submit` service (docs/docker.md): as the demo's operator (its key in
# the operator volume, which no other service mounts), submit every job file of /etc/xclp/jobs over
# the coordinator's Admin API (TLS to coordinator:50052), wait until the runs are over, then play
# the evaluator: docker/summary.py prints the table. Exit status: summary.py's (0 only when every
# institution has its predictions and the common FlyNN model).
#
# More jobs on a running stack: docker compose run --rm submit xclp-server job submit /etc/xclp/jobs/<file>
set -u
runs=/tmp/runs.json
# The XCLP job first, so that the demo's first run, the one its table shows first, is run 1.
set --
for f in /etc/xclp/jobs/*.toml; do grep -q '^type *= *"xclp"' "$f" && set -- "$@" "$f"; done
for f in /etc/xclp/jobs/*.toml; do grep -q '^type *= *"xclp"' "$f" || set -- "$@" "$f"; done
xclp-server job submit "$@" --wait --json > "$runs"
exec python /opt/xclp/compose/summary.py --runs "$runs"
