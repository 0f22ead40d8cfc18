#!/bin/sh
# hospital-a's own Dask cluster in the compose demo (`docker compose --profile cluster up`,
# docs/docker.md): `cluster.sh scheduler` or `cluster.sh worker <name>`. Mutual TLS with the
# institution's own cluster CA (docker/setup.sh writes it into the hospital-a-cluster volume,
# mounted read-only at /etc/xclp/cluster); the scheduler on port 8786 of the demo's network, which
# only hospital-a's agent dials. One thread per worker process: Paillier work is Python-level
# big-integer arithmetic.
#
# By default the cluster ends by itself: the scheduler closes after XCLP_CLUSTER_IDLE (120s) with
# no task, and each worker with it (no nanny restarts it). XCLP_KEEP_RUNNING=1 keeps them up.
set -eu
certs=/etc/xclp/cluster
role=${1:?usage: cluster.sh scheduler | worker <name>}
case $role in
  scheduler)
    set -- --protocol tls --host 0.0.0.0 --port 8786 --no-dashboard \
      --tls-ca-file "$certs/ca.pem" --tls-cert "$certs/scheduler.pem" --tls-key "$certs/scheduler-key.pem"
    [ "${XCLP_KEEP_RUNNING:-0}" = 1 ] || set -- "$@" --idle-timeout "${XCLP_CLUSTER_IDLE:-120s}"
    exec dask scheduler "$@"
    ;;
  worker)
    name=${2:?usage: cluster.sh worker <name>}
    exec dask worker tls://hospital-a-scheduler:8786 --name "$name" --nthreads 1 --no-nanny --no-dashboard \
      --death-timeout 60 \
      --tls-ca-file "$certs/ca.pem" --tls-cert "$certs/worker.pem" --tls-key "$certs/worker-key.pem"
    ;;
  *)
    echo "cluster.sh: unknown role $role (scheduler or worker)" >&2
    exit 2
    ;;
esac
