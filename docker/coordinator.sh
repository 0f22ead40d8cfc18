#!/bin/sh
# A one-shot coordinator (docs/docker.md): serves every job file of /etc/xclp/jobs
# (read-only mount) from a copy in its own volume, so each job's relative output paths (the XCLP
# run summary) land in the volume, and exits once every job is done or failed. `started` and
# `finished` in the volume say where it is. The compose demo runs the coordinator as a service
# instead (docker/service.sh).
set -eu
cd /var/lib/xclp
rm -rf jobs finished
touch started
mkdir jobs
cp /etc/xclp/jobs/*.toml jobs/
set --
for job in jobs/*.toml; do set -- "$@" --job "$job"; done
xclp-server serve --listen "0.0.0.0:${XCLP_PORT:-50051}" --allow-list allow.toml "$@" \
    --tls-cert certs/server.pem --tls-key certs/server-key.pem --exit-when-done &
server=$!
# `docker stop` (SIGTERM via docker-init) reaches this shell: pass it on, the server shuts down cleanly.
trap 'kill -TERM "$server" 2>/dev/null' TERM INT
set +e
wait "$server"
rc=$?
while kill -0 "$server" 2>/dev/null; do wait "$server"; rc=$?; done
echo "$rc" > finished
exit "$rc"
