#!/bin/sh
# The compose demo's `coordinator` service (docs/docker.md): `xclp-server serve --config server.toml`
# as a service, with no job file: the `submit` service submits the demo's jobs over the Admin API.
# docker/setup.sh wrote server.toml into this volume: the state file (state/xclp.db, so `job list`
# shows every earlier `up`'s runs), the Admin API on :50052 (TLS, the demo operator's key), metrics
# on :9464 and the gRPC health service the health check asks.
#
# By default the demo ends by itself: the coordinator exits once the submitted runs are over
# (--exit-when-done). XCLP_KEEP_RUNNING=1 keeps it up for more jobs (docs/docker.md).
set -eu
cd /var/lib/xclp
mkdir -p state
set -- --config server.toml
[ "${XCLP_KEEP_RUNNING:-0}" = 1 ] || set -- "$@" --exit-when-done
# exec: docker-init (PID 1) hands `docker stop`'s SIGTERM straight to the server, which stops cleanly.
exec xclp-server serve "$@"
