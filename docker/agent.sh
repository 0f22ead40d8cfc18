#!/bin/sh
# The compose demo's institution services (docs/docker.md): an always-on party agent
# (`xclp-client agent`) with a catalogue of one data set, "demo" = /data/<party>.csv (a read-only
# mount of its own CSV alone). It takes part in the runs the coordinator offers it that its policy
# accepts (xclp and flynn jobs, at least XCLP_MIN_PARTIES parties) and writes each run's outputs to
# runs/<job>/<run>/ in its results volume (the working directory):
#   runs/xclp-demo/<run>/predictions.csv   id (its own row ids), label, confidence, score_<c>
#   runs/flynn-demo/<run>/model.npz        the federated FlyNN model (identical at every institution)
#   runs/<job>/<run>/run.json              run id, job, participants, when
# By default it stops after XCLP_AGENT_RUNS runs (2: the demo's XCLP and FlyNN runs) and exits 0
# only if every one was done; XCLP_KEEP_RUNNING=1 keeps it up.
#
# Environment: XCLP_PARTY (required), XCLP_COORDINATOR (coordinator:50051), XCLP_INSECURE_TEST_KEYS
# (1 = accept Paillier keys below 2048 bits; tests only), XCLP_MIN_PARTIES (2), XCLP_IDLE_TIMEOUT
# (seconds without news before a run is given up; the client's default when empty), XCLP_ID_COLUMN
# (row_id) and XCLP_LABEL_COLUMN (label) of /data/<party>.csv, XCLP_CLUSTER_SCHEDULER (the host name
# of the institution's own Dask scheduler, used when it resolves; certificates in /etc/xclp/cluster).
set -eu
party=${XCLP_PARTY:?set XCLP_PARTY to this institution id}
secrets=/etc/xclp/secrets
cd /var/lib/xclp
insecure=false
[ "${XCLP_INSECURE_TEST_KEYS:-0}" != 1 ] || insecure=true
idle=""
[ -z "${XCLP_IDLE_TIMEOUT:-}" ] || idle="idle_timeout = $XCLP_IDLE_TIMEOUT"
# The institution's own Dask cluster, when `docker compose --profile cluster up` started it: its
# scheduler's name resolves on the demo's network (it starts with the coordinator, which this
# service waits for), and the agent sends its Paillier work there over mutual TLS.
workers=""
if [ -n "${XCLP_CLUSTER_SCHEDULER:-}" ] && getent hosts "$XCLP_CLUSTER_SCHEDULER" >/dev/null; then
  workers="workers = \"tls://$XCLP_CLUSTER_SCHEDULER:8786\""
  export DASK_DISTRIBUTED__COMM__TLS__CA_FILE=/etc/xclp/cluster/ca.pem \
         DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=/etc/xclp/cluster/party.pem \
         DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY=/etc/xclp/cluster/party-key.pem
fi
cat > agent.toml <<TOML
# written by docker/agent.sh
party = "$party"
identity = "$secrets/$party.key"
peers = "$secrets/peers.toml"
coordinator = "${XCLP_COORDINATOR:-coordinator:50051}"
ca_cert = "$secrets/ca.pem"
out = "runs"
poll_seconds = 1
$idle
$workers

[policy]
job_types = ["xclp", "flynn"]
min_parties = ${XCLP_MIN_PARTIES:-2}
insecure_test_keys = $insecure

[datasets.demo]
path = "/data/$party.csv"
label_column = "${XCLP_LABEL_COLUMN:-label}"
id_column = "${XCLP_ID_COLUMN:-row_id}"
TOML
set --
[ "${XCLP_KEEP_RUNNING:-0}" = 1 ] || set -- --runs "${XCLP_AGENT_RUNS:-2}"
exec xclp-client agent --config agent.toml "$@"
