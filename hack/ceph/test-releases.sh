#!/usr/bin/env bash
# Runs the Ceph packages against the releases Spindle supports besides the
# default (Tentacle 20, which `make test` uses): a Reef 18 cluster (Debian
# trixie's packages, whose keys are of the old type), reached
#
#   - by Reef's own client (the test binaries run in the Reef root): the
#     contract suite of internal/ceph;
#   - by the driver's client, Tentacle 20 (the test binaries run in the
#     Tentacle root): the contract, the rbd store's cases and conformance,
#     and the lifecycle tests of e2e/rbd: the client/cluster skew a Rook
#     cluster being upgraded has.
#
#   hack/ceph/test-releases.sh            (make test-ceph)
#   hack/ceph/test-releases.sh sanity     the stock csi-sanity instead (make sanity-stock-rbd)
#
# Each cluster is started with hack/ceph-up.sh in its release's root and
# stopped at the end, whatever happens; the test binaries find it through
# SPINDLE_CEPH_DIR and SPINDLE_CEPH_MON.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
what=${1:-contract}
# The root tier's tag too: the Ceph packages' tests run as root in the Ceph root.
tags="root $(hack/go-tags.sh)"
cluster_release=${CLUSTER_RELEASE:-18}

dir=$(mktemp -d /tmp/spindle-ceph-releases-XXXXXX)
stop() { hack/ceph-down.sh "$dir/cluster" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap stop EXIT

# A port nothing listens on.
free_port() {
  local p
  while :; do
    p=$(shuf -i 20000-45000 -n 1)
    ss -Hltn "sport = :$p" | grep -q . || { echo "$p"; return; }
  done
}
mon=$(free_port)
mon1=$(free_port)
echo "test-releases: Ceph $cluster_release cluster (hack/ceph-up.sh in its root)" >&2
SPINDLE_CEPH_RELEASE=$cluster_release MON_PORT=$mon MON_V1_PORT=$mon1 OSD_BYTES=$((6 << 30)) MON_PROPOSE_INTERVAL=0.05 \
  hack/ceph-up.sh "$dir/cluster" spindle-test spindle-test-b >"$dir/ceph-up.log" 2>&1 ||
  { cat "$dir/ceph-up.log" >&2; exit 1; }
hack/ceph/run -r "$cluster_release" rbd -c "$dir/cluster/ceph.conf" namespace create spindle-test/ns1
hack/ceph/run -r "$cluster_release" ceph -c "$dir/cluster/ceph.conf" versions
export SPINDLE_CEPH_DIR=$dir/cluster SPINDLE_CEPH_MON=127.0.0.1:$mon SPINDLE_CEPH_MON_V1=v1:127.0.0.1:$mon1

rc=0
run() {
  echo "test-releases: $*" >&2
  "$@" || rc=1
}
case $what in
contract)
  run go test -count=1 -timeout 20m -tags "$tags" -exec "$here/run -r $cluster_release" -run TestContract ./internal/ceph/
  # One package at a time: they share this cluster, and each empties the
  # pool and reads the blocklist as its own.
  run go test -p 1 -count=1 -timeout 30m -tags "$tags" -exec "$here/run -r 20" ./internal/ceph/ ./internal/backend/rbd/ ./e2e/rbd/
  ;;
sanity)
  run go test -count=1 -timeout 30m -tags "$tags" -exec "$here/run -r 20" -run TestStockSanityRBD ./e2e/sanity/rbd/
  ;;
*)
  echo "usage: $0 [contract|sanity]" >&2
  exit 2
  ;;
esac
exit $rc
