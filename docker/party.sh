#!/bin/sh
# A one-off institution (docs/docker.md): `xclp-client run` for the XCLP job, then
# the FlyNN job, with its own CSV, writing into its results volume (the working directory):
#   predictions.csv    XCLP: id (its own row ids), label, confidence, score_<c>
#   flynn-model.npz    the federated FlyNN model (identical at every institution)
#   status             one line per job: "<job> <exit code>" (0 = done, 5 = dropped or timed out)
#   finished           written last
# Exits 0 only if both jobs succeeded. A lost XCLP job does not skip the FlyNN job: they are
# independent, as they would be for a real institution.
#
# Environment: XCLP_PARTY (required), XCLP_COORDINATOR (coordinator:50051), XCLP_XCLP_JOB
# (xclp-demo), XCLP_FLYNN_JOB (flynn-demo), XCLP_KEY_BITS (2048, the xclp job's key_bits),
# XCLP_INSECURE_TEST_KEYS (1 = allow keys below 2048 bits; tests only), XCLP_JOIN_WAIT and
# XCLP_IDLE_TIMEOUT (seconds; the client's defaults when empty), XCLP_ID_COLUMN (row_id) and
# XCLP_LABEL_COLUMN (label) of /data/<party>.csv.
set -u
party=${XCLP_PARTY:?set XCLP_PARTY to this institution id}
secrets=/etc/xclp/secrets
cd /var/lib/xclp
rm -f predictions.csv flynn-model.npz status finished   # never report an earlier run's results

set -- --coordinator "${XCLP_COORDINATOR:-coordinator:50051}" --ca-cert "$secrets/ca.pem" \
    --party "$party" --identity "$secrets/$party.key" --peers "$secrets/peers.toml" --data "/data/$party.csv" \
    --id-column "${XCLP_ID_COLUMN:-row_id}" --label-column "${XCLP_LABEL_COLUMN:-label}"
# The demo's jobs go on with two institutions when one is lost (min_parties = 2), so each party
# accepts masked sums among two (XCLP_MIN_PARTIES; the client's own default is 3).
set -- "$@" --min-parties "${XCLP_MIN_PARTIES:-2}"
[ -z "${XCLP_JOIN_WAIT:-}" ] || set -- "$@" --connect-timeout "$XCLP_JOIN_WAIT"
[ -z "${XCLP_IDLE_TIMEOUT:-}" ] || set -- "$@" --idle-timeout "$XCLP_IDLE_TIMEOUT"

insecure=""
[ "${XCLP_INSECURE_TEST_KEYS:-0}" != 1 ] || insecure=--insecure-test-keys
xclp_job=${XCLP_XCLP_JOB:-xclp-demo}
# shellcheck disable=SC2086  # $insecure is one flag or nothing
xclp-client run "$@" --job "$xclp_job" --paillier-bits "${XCLP_KEY_BITS:-2048}" $insecure --out .
xclp_rc=$?
echo "$xclp_job $xclp_rc" >> status

flynn_job=${XCLP_FLYNN_JOB:-flynn-demo}
xclp-client run "$@" --job "$flynn_job" --out flynn-model.npz
flynn_rc=$?
echo "$flynn_job $flynn_rc" >> status

printf 'party: %s: %s exit %d, %s exit %d\n' "$party" "$xclp_job" "$xclp_rc" "$flynn_job" "$flynn_rc" >&2
touch finished
[ "$xclp_rc" = 0 ] && [ "$flynn_rc" = 0 ]
