#!/usr/bin/env bash
# Starts a throw-away single-node Ceph cluster for Spindle's RBD tests: 1
# mon, 1 mgr, 1 memstore OSD, all on 127.0.0.1, everything (config,
# keyrings, pid files, logs, the mon's store) under DIR, nothing in /etc/ceph
# or /var/lib/ceph. Based on the shared recipe (shared/recipes/backends).
# The daemons are those of a Ceph root (hack/ceph/root.sh): Tentacle 20 by
# default, SPINDLE_CEPH_RELEASE=18 for Reef; outside a root the script runs
# itself in one (hack/ceph/run), and the daemons stay there.
#
#   hack/ceph-up.sh DIR [POOL...]      then: export CEPH_CONF=DIR/ceph.conf
#
# MON_PORT (default 3300) and MON_V1_PORT (default 6789) pick the monitor's
# msgr2 and msgr1 ports, so that test packages running in parallel each get
# a cluster of their own. Every POOL is created (size 1, 8 PGs) and tagged
# for rbd. The OSD holds at most OSD_BYTES (default 2 GiB) in memory.
# CEPH_IP (default 127.0.0.1) is the address every daemon binds and the
# monitor advertises, CEPH_NET (default 127.0.0.0/8, or CEPH_IP/32 for
# another address) the public network: hack/vm/services.sh runs the cluster
# in the qemu guests' network namespace on 192.168.77.1.
# MON_PROPOSE_INTERVAL (seconds; default Ceph's own, 1) is how long the
# monitor gathers changes before it commits them: every snapshot create or
# remove waits for one commit (a new snapshot ID), so the tests shorten it
# (cephtest.Start: 0.05) and the benchmarks keep Ceph's default, which is
# what users' clusters run.
# ADMIN_KEY_CIPHER=aes makes client.admin's key of the cipher of the releases
# before Tentacle (aes) and has the monitors allow it again beside their
# default (aes256k), as docs/backends.md tells users of clients that cannot
# use aes256k keys: the qemu guests' kernels (krbd before Linux 7.0) and
# their Debian 12 Ceph 16 tools, and the driver run as a host process,
# which links this machine's Ceph 16 libraries. Default: Tentacle's own.
# Stop it with hack/ceph-down.sh DIR.
set -euo pipefail
if [ ! -r /etc/spindle-ceph-root ]; then
  exec "$(cd "$(dirname "$0")" && pwd)/ceph/run" "$(cd "$(dirname "$0")" && pwd)/ceph-up.sh" "$@"
fi
D=$(realpath -m "${1:?usage: $0 DIR [POOL...]}")
shift
# The daemons run from /: Debian's ceph-osd (20.2.4) loads its object
# classes (cls_rbd, cls_lock) from a path relative to its working
# directory, and fails every rbd call elsewhere.
cd /
MON_PORT=${MON_PORT:-3300}
MON_V1_PORT=${MON_V1_PORT:-6789}
OSD_BYTES=${OSD_BYTES:-2147483648}
CEPH_IP=${CEPH_IP:-127.0.0.1}
MON_PROPOSE_INTERVAL=${MON_PROPOSE_INTERVAL:-1}
if [ "$CEPH_IP" = 127.0.0.1 ]; then CEPH_NET=${CEPH_NET:-127.0.0.0/8}; else CEPH_NET=${CEPH_NET:-$CEPH_IP/32}; fi
export PATH="$PATH:/usr/sbin:/sbin"
T0=$(date +%s%N)
step() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[%3d.%03ds] %s\n' $((ms/1000)) $((ms%1000)) "$*"; }

for prog in ceph-mon ceph-mgr ceph-osd ceph ceph-authtool monmaptool uuidgen; do
  command -v "$prog" >/dev/null || { echo "ceph-up.sh: $prog is not in the Ceph root $(cat /etc/spindle-ceph-root) (rebuild it: hack/ceph/root.sh)" >&2; exit 3; }
done
[ -e "$D/run/mon.a.pid" ] && { echo "ceph-up.sh: a cluster in $D seems to be running; run hack/ceph-down.sh $D first" >&2; exit 1; }
rm -rf "$D"; mkdir -p "$D"/{run,log,mon.a,mgr.x,osd.0}
FSID=$(uuidgen)
MON_ADDR="[v2:$CEPH_IP:$MON_PORT,v1:$CEPH_IP:$MON_V1_PORT]"
cat > "$D/ceph.conf" <<CONF
[global]
fsid = $FSID
mon host = $MON_ADDR
public addr = $CEPH_IP
cluster addr = $CEPH_IP
public network = $CEPH_NET
ms bind ipv6 = false
keyring = $D/ceph.client.admin.keyring
run dir = $D/run
pid file = $D/run/\$name.pid
log file = $D/log/\$name.log
admin socket = $D/run/\$cluster-\$name.\$pid.asok
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1
auth allow insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
mgr initial modules = iostat
[mon]
mon data = $D/mon.\$id
paxos propose interval = $MON_PROPOSE_INTERVAL
admin socket = $D/run/\$cluster-\$name.asok
[mgr]
mgr data = $D/mgr.\$id
keyring = $D/mgr.\$id/keyring
admin socket = $D/run/\$cluster-\$name.asok
[osd]
osd data = $D/osd.\$id
keyring = $D/osd.\$id/keyring
osd objectstore = memstore
memstore device bytes = $OSD_BYTES
admin socket = $D/run/\$cluster-\$name.asok
CONF
export CEPH_CONF=$D/ceph.conf
step "config written (fsid $FSID, mon $MON_ADDR)"

ceph-authtool --create-keyring "$D/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool --create-keyring "$D/ceph.client.admin.keyring" --gen-key -n client.admin \
  --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
ceph-authtool "$D/mon.keyring" --import-keyring "$D/ceph.client.admin.keyring" >/dev/null
monmaptool --create --fsid "$FSID" --addv a "$MON_ADDR" "$D/monmap" >/dev/null
ceph-mon --mkfs -i a --monmap "$D/monmap" --keyring "$D/mon.keyring"
ceph-mon -i a
for _ in $(seq 1 60); do ceph --connect-timeout 2 mon stat >/dev/null 2>&1 && break; sleep 0.25; done
ceph --connect-timeout 5 mon stat >/dev/null
step "mon.a up"

ceph config set mgr mgr/devicehealth/enable_monitoring false --force >/dev/null 2>&1 # no device_health_metrics pool
ceph auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' > "$D/mgr.x/keyring"
ceph-mgr -i x
step "mgr.x started"

OSD_UUID=$(uuidgen)
OSD_KEY=$(ceph-authtool --gen-print-key)
OSD_ID=$(echo "{\"cephx_secret\": \"$OSD_KEY\"}" | ceph osd new "$OSD_UUID" -i -)
[ "$OSD_ID" = 0 ] || { echo "ceph-up.sh: unexpected osd id $OSD_ID" >&2; exit 1; }
ceph-authtool --create-keyring "$D/osd.0/keyring" -n osd.0 --add-key "$OSD_KEY" >/dev/null
ceph-osd -i 0 --mkfs --osd-uuid "$OSD_UUID" >"$D/log/osd.0.mkfs.log" 2>&1
ceph-osd -i 0 2>>"$D/log/osd.0.stderr"
for _ in $(seq 1 120); do ceph osd dump 2>/dev/null | grep -q '^osd.0 up' && break; sleep 0.25; done
ceph osd dump | grep -q '^osd.0 up' || { echo "ceph-up.sh: osd.0 did not come up (see $D/log)" >&2; exit 1; }
step "osd.0 up"

# Spindle's copy-on-write snapshots and clones are of clone format 2,
# which clients before Mimic cannot open (a fresh Pacific cluster requires
# Mimic already; said here so it stays true).
ceph osd set-require-min-compat-client mimic >/dev/null
step "clients must be mimic or newer (clone format 2)"

for pool in "$@"; do
  ceph osd pool create "$pool" 8 8 >/dev/null 2>&1
  ceph osd pool application enable "$pool" rbd >/dev/null
  rbd pool init "$pool" # as Rook and the docs do; RADOS namespaces need it
  step "pool $pool created"
done
if [ "${ADMIN_KEY_CIPHER:-}" = aes ]; then
  ceph mon set auth_allowed_ciphers aes256k,aes
  ceph-authtool --create-keyring "$D/admin-aes.keyring" -n client.admin --gen-key --key-type aes \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph auth import -i "$D/admin-aes.keyring" 2>/dev/null
  mv "$D/admin-aes.keyring" "$D/ceph.client.admin.keyring"
  ceph --connect-timeout 10 mon stat >/dev/null
  step "client.admin's key is of cipher aes (allowed beside aes256k)"
fi
# ceph df (pool capacity) needs an active mgr.
for _ in $(seq 1 120); do ceph mgr stat 2>/dev/null | grep -q '"available": true' && break; sleep 0.25; done
ceph mgr stat | grep -q '"available": true' || { echo "ceph-up.sh: mgr.x did not become available (see $D/log)" >&2; exit 1; }
# The rbd_support module (the "rbd task" commands the driver queues
# flattens and removals with) answers some seconds after the mgr is
# available. Debian trixie's Reef mgr never loads it (PyO3 modules in
# subinterpreters; the driver then runs those tasks itself): not waited for.
for _ in $(seq 1 120); do
  ceph rbd task list >/dev/null 2>&1 && break
  grep -q "Error loading module 'rbd_support'" "$D/log/mgr.x.log" 2>/dev/null && break
  sleep 0.25
done
ceph rbd task list >/dev/null 2>&1 && step "mgr module rbd_support answers" ||
  echo "ceph-up.sh: the mgr's rbd_support module does not answer (see $D/log/mgr.x.log)" >&2
step "mgr active; done. export CEPH_CONF=$D/ceph.conf"
