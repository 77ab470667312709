#!/usr/bin/env bash
# The host-side services a guest uses, in the guests' network namespace on
# 192.168.77.1 (hack/vm/net.sh, which `up` runs first):
#   - a throw-away Ceph (hack/ceph-up.sh: 1 mon, 1 mgr, 1 memstore OSD) with
#     the pool spindle-test, monitor 192.168.77.1:3300 (v2) / :6789 (v1);
#   - a tgtd (hack/tgtd.sh) with its portal on 192.168.77.1:3260 and no
#     targets (tests make them with tgtadm from the host: its control socket
#     is a file, so no netns is needed for that).
#
#   hack/vm/services.sh up DIR      start both; DIR holds their state and:
#     services.env                  KEY=VALUE lines, no quotes; sourceable
#                                   by sh on the host and in the guest:
#       VM_NETNS VM_HOST_IP VM_GUEST_IP VM_GUEST_IQN
#       CEPH_MON (192.168.77.1:3300) CEPH_MON_HOST (ceph.conf's "mon host")
#       CEPH_POOL CEPH_USER (admin) CEPH_KEY (its cephx key) CEPH_FSID
#       CEPH_HOST_CONF (DIR/ceph/ceph.conf: for host-side clients, which
#         must run in the netns: ip netns exec $VM_NETNS rbd -c ... ls)
#       TGT_PORTAL (192.168.77.1:3260)
#       TGT_SOCKET (DIR/tgtd/tgtd.socket: TGT_IPC_SOCKET=$TGT_SOCKET tgtadm ...)
#     ceph.conf                     for the guest: mon host and the key
#                                   inline, so `rbd -c ceph.conf` needs no
#                                   other file (nothing goes in /etc/ceph)
#     ceph.client.admin.keyring     the same key as a keyring
#     client.admin.key              the bare key (the rbd backend's keyFile)
#   hack/vm/services.sh down DIR    stop both (only the PIDs they recorded)
#                                   and delete the netns; idempotent
#
# Copy the guest's files into the run's SHAREDIR (or use DIR inside it).
# Logs: DIR/ceph-up.log, DIR/ceph/log/, DIR/tgtd/tgtd.log.
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
. "$(dirname "$0")/lib.sh"

POOL=spindle-test
GUEST_IQN=iqn.2026-01.dev.spindle:vm-guest # as hack/vm/build.sh sets it
op=${1:-}
D=${2:-}
if [ -z "$D" ] || { [ "$op" != up ] && [ "$op" != down ]; }; then
  echo "usage: $0 up|down DIR" >&2
  exit 2
fi
[ "$(id -u)" = 0 ] || die "needs root"
D=$(realpath -m "$D")

down() {
  local rc=0
  [ ! -d "$D/tgtd" ] || "$REPO/hack/tgtd.sh" stop "$D/tgtd" >/dev/null || rc=1
  [ ! -d "$D/ceph" ] || "$REPO/hack/ceph-down.sh" "$D/ceph" >/dev/null || rc=1
  "$VM_DIR/net.sh" down || rc=1
  return $rc
}

case $op in
down)
  down
  log "services in $D stopped"
  exit 0
  ;;
esac

if [ -s "$D/ceph/run/mon.a.pid" ] && alive "$(cat "$D/ceph/run/mon.a.pid")"; then
  die "services in $D are already up (hack/vm/services.sh down $D first)"
fi
mkdir -p "$D"
# up: on any failure, stop what was started.
trap 'echo "services.sh: up failed; stopping what started" >&2; down >&2 || true' ERR
T0=$(now_us)
"$VM_DIR/net.sh" up >/dev/null

t=$(now_us)
# The guests' kernels (Debian 12's 6.1) take no aes256k keys (Linux 7.0
# does) and their Debian 12 Ceph 16 tools cannot read one: the key the
# guests use is of cipher aes (docs/backends.md, krbd with Tentacle's
# default keys).
if ! in_netns env CEPH_IP="$VM_HOST_IP" CEPH_NET="$VM_HOST_IP/$VM_PREFIX" ADMIN_KEY_CIPHER=aes \
  "$REPO/hack/ceph-up.sh" "$D/ceph" "$POOL" >"$D/ceph-up.log" 2>&1; then
  tail -20 "$D/ceph-up.log" >&2
  false
fi
log "ceph up on $VM_HOST_IP (pool $POOL): $(since "$t") s"

t=$(now_us)
in_netns env TGT_ADDR="$VM_HOST_IP" "$REPO/hack/tgtd.sh" start "$D/tgtd" 3260 >/dev/null
log "tgtd up on $VM_HOST_IP:3260: $(since "$t") s"

FSID=$(sed -n 's/^fsid = //p' "$D/ceph/ceph.conf")
KEY=$(sed -n 's/^[[:space:]]*key = //p' "$D/ceph/ceph.client.admin.keyring")
if [ -z "$FSID" ] || [ -z "$KEY" ]; then echo "services.sh: no fsid or admin key in $D/ceph" >&2; false; fi
MON_HOST="[v2:$VM_HOST_IP:3300,v1:$VM_HOST_IP:6789]"
cat >"$D/ceph.conf" <<EOF
# The guest's view of the cluster hack/vm/services.sh started.
[global]
fsid = $FSID
mon host = $MON_HOST
[client.admin]
key = $KEY
EOF
cp "$D/ceph/ceph.client.admin.keyring" "$D/ceph.client.admin.keyring"
echo "$KEY" >"$D/client.admin.key"
# KEY=VALUE lines, no quoting: sourceable by sh and trivial to parse.
env_line() {
  [[ $2 != *[[:space:]\'\"\$\`\\]* ]] || { echo "services.sh: $1 has a character services.env cannot hold: $2" >&2; return 1; }
  echo "$1=$2"
}
{
  echo "# hack/vm/services.sh up $D"
  env_line VM_NETNS "$VM_NETNS"
  env_line VM_HOST_IP "$VM_HOST_IP"
  env_line VM_GUEST_IP "$VM_GUEST_IP"
  env_line VM_GUEST_IQN "$GUEST_IQN"
  env_line CEPH_MON "$VM_HOST_IP:3300"
  env_line CEPH_MON_HOST "$MON_HOST"
  env_line CEPH_POOL "$POOL"
  env_line CEPH_USER admin
  env_line CEPH_KEY "$KEY"
  env_line CEPH_FSID "$FSID"
  env_line CEPH_HOST_CONF "$D/ceph/ceph.conf"
  env_line TGT_PORTAL "$VM_HOST_IP:3260"
  env_line TGT_SOCKET "$D/tgtd/tgtd.socket"
} >"$D/services.env"
log "up in $(since "$T0") s; $D/services.env"
