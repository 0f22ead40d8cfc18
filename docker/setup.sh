#!/bin/sh
# The compose demo's one-shot `setup` service (docs/docker.md): what the coordinator's operator
# and the institutions would each do once, here in one container so `docker compose up` needs
# nothing else. It runs as root only to hand the fresh volumes to the image's user (uid 10001).
#
#   /vol/ca            dev CA (ca.pem, ca-key.pem): only this service ever mounts it
#   /vol/coordinator   certs/server.pem + server-key.pem + ca.pem, allow.toml (the coordinator's volume)
#   /vol/<party>       <party>.key (private), <party>.pub, ca.pem, peers.toml (the allow-list it pins)
#                      (that institution's secrets volume)
#   /vol/operator      demo.key (the demo operator's Admin API key, private), demo.pub, ca.pem
#                      (the operator volume: only setup and `submit` mount it)
#   /vol/cluster-ca    hospital-a's own cluster CA (only setup mounts it), and
#   /vol/cluster       its scheduler's, workers' and agent's certificates and keys, ca.pem (the
#                      hospital-a-cluster volume: hospital-a and its cluster, profile "cluster")
# and the coordinator's server.toml: no job file, the state file, the Admin API with the demo
# operator's key, metrics, TLS.
#
# Idempotent: a re-run keeps the CA and the identity keys, re-issues the server certificate
# (for the names in XCLP_SERVER_NAMES) and rewrites the allow-list.
#
# Environment: XCLP_PARTIES (space-separated ids), XCLP_SERVER_NAMES (DNS names and IPs the
# institutions dial; IPs are recognised by their dots and digits).
set -eu
umask 077
PARTIES=${XCLP_PARTIES:-hospital-a hospital-b hospital-c}
NAMES=${XCLP_SERVER_NAMES:-coordinator localhost 127.0.0.1}
XCLP_UID=10001

say() { printf 'setup: %s\n' "$*" >&2; }

if [ -f /vol/ca/ca.pem ] && [ -f /vol/ca/ca-key.pem ]; then
  say "reusing the dev CA in the ca volume"
else
  xclp-server ca init --dir /vol/ca
fi

set --
for name in $NAMES; do
  case $name in
    *[!0-9.]*) set -- "$@" --dns "$name" ;;
    *) set -- "$@" --ip "$name" ;;
  esac
done
xclp-server cert server --ca-dir /vol/ca --out /vol/coordinator/certs "$@"
# the CA certificate (public) too, for the coordinator's gRPC health check (docker/healthcheck.py)
cp /vol/ca/ca.pem /vol/coordinator/certs/ca.pem

allow=/vol/coordinator/allow.toml.tmp
printf '# written by docker/setup.sh: the identities the coordinator admits\n[parties]\n' > "$allow"
for party in $PARTIES; do
  dir=/vol/$party
  [ -d "$dir" ] || { say "error: no volume mounted at $dir for $party"; exit 2; }
  if [ -f "$dir/$party.key" ] && [ -f "$dir/$party.pub" ]; then
    say "reusing the identity key of $party"
  else
    xclp-client keygen --party "$party" --out "$dir" >/dev/null
  fi
  cp /vol/ca/ca.pem "$dir/ca.pem"
  chmod 0644 "$dir/ca.pem" "$dir/$party.pub"
  printf '%s = "%s"\n' "$party" "$(cat "$dir/$party.pub")" >> "$allow"
done
mv "$allow" /vol/coordinator/allow.toml
# Every institution pins the same list (`--peers`): the coordinator cannot swap a peer's key.
for party in $PARTIES; do
  cp /vol/coordinator/allow.toml "/vol/$party/peers.toml"
  chmod 0644 "/vol/$party/peers.toml"
done

if [ -f /vol/operator/demo.key ] && [ -f /vol/operator/demo.pub ]; then
  say "reusing the demo operator's key"
else
  rm -f /vol/operator/demo.key /vol/operator/demo.pub
  # it writes demo.key and demo.pub (the bare public key, as a party's keygen does)
  xclp-server operator keygen --name demo --out /vol/operator > /dev/null
fi
cp /vol/ca/ca.pem /vol/operator/ca.pem
chmod 0644 /vol/operator/ca.pem /vol/operator/demo.pub
# a demo.pub from before held the whole [operators] line (demo = "ed25519:..."): its key alone
operator_key=$(sed -e 's/^demo = "//' -e 's/"$//' /vol/operator/demo.pub)
cat > /vol/coordinator/server.toml.tmp <<TOML
# written by docker/setup.sh: the coordinator as a service (docs/operating.md)
listen = "0.0.0.0:50051"
allow_list = "allow.toml"
state = "state/xclp.db"
admin_listen = "0.0.0.0:50052"   # off the host only over TLS: the submit service dials coordinator:50052
metrics_listen = "0.0.0.0:9464"

[operators]
demo = "$operator_key"

[tls]
cert = "certs/server.pem"
key = "certs/server-key.pem"
TOML
mv /vol/coordinator/server.toml.tmp /vol/coordinator/server.toml

# hospital-a's own Dask cluster (`docker compose --profile cluster up`, docs/docker.md): a CA of the
# institution's own, not the dev CA above, and node certificates (serverAuth and clientAuth: Dask's
# nodes listen and dial) for its scheduler, its workers and its agent, in its cluster volume.
if [ -d /vol/cluster-ca ] && [ -d /vol/cluster ]; then
  [ -f /vol/cluster-ca/ca-key.pem ] || xclp-server ca init --dir /vol/cluster-ca 2>/dev/null
  for node in scheduler worker party; do
    xclp-server cert node --ca-dir /vol/cluster-ca --out /vol/cluster --name "$node" --dns "$node" 2>/dev/null
  done
  cp /vol/cluster-ca/ca.pem /vol/cluster/ca.pem
  chmod 0644 /vol/cluster/ca.pem
  chown -R "$XCLP_UID:$XCLP_UID" /vol/cluster
  say "hospital-a's cluster CA and certificates for its scheduler, workers and agent"
fi

chown -R "$XCLP_UID:$XCLP_UID" /vol/ca /vol/coordinator /vol/operator
for party in $PARTIES; do chown -R "$XCLP_UID:$XCLP_UID" "/vol/$party"; done
say "dev CA, server certificate for: $NAMES; identity keys and allow-list for: $PARTIES; the demo operator's key"
