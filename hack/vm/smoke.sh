#!/usr/bin/env bash
# Smoke test of the qemu guest infrastructure, end to end:
#   build (cached) -> net + services up -> one tgt target and one RBD image made
#   from the host -> a guest that loads rbd, nbd, iscsi_tcp and target_core_mod,
#   lists the pool with `rbd -c ceph.conf ls` and discovers the target with
#   iscsiadm -> everything torn down, and checked to be gone.
#
#   hack/vm/smoke.sh        (root; TIMEOUT, MEM, SMP as for run.sh)
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || die "needs root"
# The netns is one per machine (VM_NETNS names another): not while someone
# else's services or guest use it.
! netns_exists || die "netns $VM_NETNS exists already (another run? hack/vm/services.sh down DIR)"
IQN=iqn.2026-01.dev.spindle:smoke
W=$(mktemp -d /tmp/spindle-vm-smoke.XXXXXX)
PIDS= # the daemons services.sh started
SVC=$W/svc
SHARE=$W/share

teardown() {
  local rc=$?
  "$VM_DIR/services.sh" down "$SVC" || rc=1
  # Nothing of ours may survive: the netns, the daemons it ran, a qemu.
  if netns_exists; then echo "smoke: netns $VM_NETNS is still there" >&2; rc=1; fi
  local left
  left=$(pgrep -af "qemu-system-x86_64.*path=$SHARE," || true)
  for p in $PIDS; do alive "$p" && left="$left $p($(cat "/proc/$p/comm" 2>/dev/null))"; done
  if [ -n "$left" ]; then echo "smoke: processes left behind: $left" >&2; rc=1; fi
  rm -rf "$W"
  exit $rc
}
trap teardown EXIT

t=$(now_us)
"$VM_DIR/build.sh"
echo "smoke: build.sh took $(since "$t") s"

"$VM_DIR/services.sh" up "$SVC"
# shellcheck source=/dev/null
. "$SVC/services.env"
PIDS=$(cat "$SVC"/ceph/run/*.pid "$SVC/tgtd/tgtd.pid")

# One target with one LUN, visible to the guest, so discovery finds something.
truncate -s 64M "$SVC/lun1.img"
adm() { TGT_IPC_SOCKET=$TGT_SOCKET tgtadm --lld iscsi "$@"; }
adm --mode target --op new --tid 1 --targetname "$IQN"
adm --mode logicalunit --op new --tid 1 --lun 1 --backing-store "$SVC/lun1.img"
adm --mode target --op bind --tid 1 --initiator-address "$VM_GUEST_IP"
# One image, made from the host side (in the netns), for the guest to list.
in_netns rbd -c "$CEPH_HOST_CONF" create --size 16M "$CEPH_POOL/smoke"

mkdir -p "$SHARE"
cp "$SVC/ceph.conf" "$SVC/services.env" "$SHARE/"
cat >"$SHARE/run.sh" <<'EOF'
#!/bin/bash
# Runs in the guest, in /mnt/share.
set -euo pipefail
. ./services.env
echo "guest kernel: $(uname -r)"
for m in rbd nbd iscsi_tcp target_core_mod; do
  modprobe "$m"
  [ -d "/sys/module/$m" ]
  echo "modprobe $m: ok"
done
images=$(timeout 60 rbd -c ./ceph.conf ls "$CEPH_POOL")
echo "rbd ls $CEPH_POOL: $images"
[ "$images" = smoke ]
targets=$(timeout 60 iscsiadm -m discovery -t sendtargets -p "$TGT_PORTAL")
echo "iscsiadm discovery: $targets"
grep -q "^$TGT_PORTAL,1 iqn.2026-01.dev.spindle:smoke$" <<<"$targets"
echo "SMOKE OK"
EOF
chmod +x "$SHARE/run.sh"

TIMEOUT=${TIMEOUT:-600} "$VM_DIR/run.sh" "$SHARE"
grep -q '^SMOKE OK$' "$SHARE/out/run.log"
# shellcheck source=/dev/null
. "$SHARE/out/vm.env"
echo "smoke: passed (boot $VM_BOOT_SECONDS s, whole guest run $VM_TOTAL_SECONDS s, qemu peak RSS $((VM_PEAK_RSS_KB / 1024)) MiB, accel $VM_ACCEL)"
