#!/usr/bin/env bash
# `make e2e-storage`: the Kubernetes external storage suite (e2e.test from
# k8s.io/kubernetes, -ginkgo.focus='External.Storage') against Spindle on the
# local cluster, one run per testdriver in e2e/storage/testdrivers (one per
# StorageClass: loop ext4, loop xfs, loop block, rbd, iscsi), and rbd-static:
# the pre-provisioned PV patterns, which need Spindle's own Go testdriver
# (e2e/storage/rbdstatic, run as spindle-storage.test: it makes the RBD
# images the PVs name). Each run ends with ginkgo's own summary
# (`Ran N of M Specs ... X Passed | Y Failed`).
#
# The cluster runs the driver as a host process (DEPLOY=process) with a
# backend configuration holding every backend: the loop pool on an xfs of
# its own (POOL_FS=xfs: snapshots and clones of volumes in use need
# reflink), Ceph RBD through rbd-fuse on a throw-away Ceph (hack/ceph-up.sh)
# and iSCSI in userspace mode against a tgtd (hack/tgtd.sh; its pool on a
# reflink xfs as well), both on 127.0.0.1 and under $STATE, outside the
# cluster's directory.
#
#   DRIVERS   which testdrivers (default: all six)
#   PROCS     ginkgo's parallel processes (default 3; the specs mostly wait)
#   SKIP      a ginkgo regexp of specs not to run (default: see below)
#   STATE     Ceph, tgtd, the iSCSI pool and the reports (default
#             /var/tmp/spindle-e2e-storage; reports in $STATE/reports)
#
# Exits non-zero when a run had failures or could not start.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/local-cluster/env.sh
. "$HERE/env.sh"
export CLUSTER_DIR
cd "$REPO" || exit 1
DRIVERS=${DRIVERS:-loop-ext4 loop-xfs loop-block rbd rbd-static iscsi}
PROCS=${PROCS:-3}
STATE=${STATE:-/var/tmp/spindle-e2e-storage}
# Not run: [Disruptive] specs restart kubelet or reboot nodes over SSH, and
# this cluster's one node is this machine; Windows' and SELinux's specs;
# "any volume data source", which needs the sample volume populator's
# controller and images (lib-volume-populator), not assembled here; "should
# not mount / map unused volumes", which inspects the node by entering PID
# 1's mount namespace from a hostexec pod, and the sandbox these machines
# run in refuses that (/proc/1/ns/mnt: permission denied).
SKIP=${SKIP:-'\[Disruptive\]|\[Feature:Windows\]|\[Feature:SELinux\]|should provision storage with any volume data source|should not mount / map unused volumes in a pod'}
phase() { echo "e2e-storage: $1 took $(($2))s"; }
wants() { [[ " $DRIVERS " == *" $1 "* ]]; }
wants_ceph() { wants rbd || wants rbd-static; }
# The rbd backend's cluster and pool (the pre-provisioned PVs name them).
RBD_CLUSTER=e2e RBD_POOL=spindle-e2e
# The rbd CLI runs in the Ceph root of the cluster's release (hack/ceph/run):
# this machine has no Ceph CLI of its own.
RBD_COMMAND="$REPO/hack/ceph/run rbd"
rbd_cli() { $RBD_COMMAND --conf "$STATE/ceph/ceph.conf" "$@"; }
# static_images_left: the images of pre-provisioned PVs (rbdstatic names
# them e2e-static-*) still in the pool or its trash; fails when it cannot
# tell.
static_images_left() {
  local images trash
  images=$(rbd_cli ls "$RBD_POOL") && trash=$(rbd_cli trash ls "$RBD_POOL") || return 1
  printf '%s\n%s\n' "$images" "$trash" | grep 'e2e-static-'
  return 0
}

t=$SECONDS
"$REPO/hack/install-deps.sh" || exit 1
E2E_SUITE=1 "$HERE/build.sh" || { echo "e2e-storage: building the cluster failed"; exit 1; }
make --no-print-directory build >/dev/null || exit 1
IMAGES_DIR=$STATE/images "$REPO/hack/images.sh" e2e >/dev/null || exit 1
phase build $((SECONDS - t))

# cleanup: the cluster, then what served its backends.
cleanup() {
  "$HERE/down.sh" >/dev/null 2>&1
  pkill -f "qemu-storage-daemon.*$STATE" 2>/dev/null
  # Loop devices before and after the unmounts: before, while their
  # backing files' paths still name $STATE (a busy one detaches when
  # released); after, for the iSCSI pool's own image.
  local pass dev
  for pass in before after; do
    [ "$pass" = after ] && grep " $STATE" /proc/self/mountinfo | awk '{print $5}' | sort -r |
      while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    for dev in $(losetup -n -O NAME,BACK-FILE 2>/dev/null | awk -v d="$STATE/" 'index($2, d) == 1 {print $1}'); do losetup -d "$dev" 2>/dev/null; done
  done
  "$REPO/hack/tgtd.sh" stop "$STATE/tgtd" >/dev/null 2>&1
  "$REPO/hack/ceph-down.sh" "$STATE/ceph" >/dev/null 2>&1
}
cleanup # what a killed run left behind
rm -rf "$STATE/reports" "$STATE/testdrivers" "$STATE/iscsi" "$STATE/iscsi-pool.img" && mkdir -p "$STATE/reports" "$STATE/testdrivers"
trap cleanup EXIT


# --- the backends and the driver's configuration.
t=$SECONDS
config=$STATE/spindle.yaml
cat >"$config" <<YAML
defaultBackend: loop/default
backends:
  - type: loop
    name: default
    loop:
      poolDir: "$POOL_DIR"
YAML
if wants_ceph; then
  # The driver as a host process links this machine's Ceph 16 libraries
  # (its rbd-fuse mounter runs this machine's qemu-storage-daemon), which
  # read only keys of the older cipher (docs/backends.md).
  ADMIN_KEY_CIPHER=aes MON_PORT=3390 MON_V1_PORT=6799 "$REPO/hack/ceph-up.sh" "$STATE/ceph" "$RBD_POOL" >"$STATE/ceph-up.log" 2>&1 ||
    { echo "e2e-storage: Ceph did not start:"; tail -5 "$STATE/ceph-up.log"; exit 1; }
  (umask 077 && sed -n 's/^[[:space:]]*key = //p' "$STATE/ceph/ceph.client.admin.keyring" | tr -d '\n' >"$STATE/ceph/admin.key")
  [ -s "$STATE/ceph/admin.key" ] || { echo "e2e-storage: no admin key in $STATE/ceph"; exit 1; }
  cat >>"$config" <<YAML
  - type: rbd
    name: ceph
    rbd:
      clusterID: $RBD_CLUSTER
      monitors: ["127.0.0.1:3390"]
      pool: $RBD_POOL
      userID: admin
      keyFile: "$STATE/ceph/admin.key"
      mounter: rbd-fuse
      fuseDir: "$STATE/rbd-fuse"
      nodeRegistry: true
YAML
fi
if wants iscsi; then
  "$REPO/hack/tgtd.sh" start "$STATE/tgtd" 3269 || { echo "e2e-storage: tgtd did not start"; exit 1; }
  mkdir -p "$STATE/iscsi/pool" "$STATE/iscsi/state"
  # The iSCSI pool on a reflink xfs of its own too: the suite clones and
  # snapshots volumes in use, which a pool without reflink refuses.
  truncate -s 64G "$STATE/iscsi-pool.img" && mkfs.xfs -q -f -m reflink=1 "$STATE/iscsi-pool.img" &&
    mount -o loop "$STATE/iscsi-pool.img" "$STATE/iscsi/pool" || { echo "e2e-storage: the iSCSI pool's xfs failed"; exit 1; }
  cat >>"$config" <<YAML
  - type: iscsi
    name: san
    iscsi:
      poolDir: "$STATE/iscsi/pool"
      portals: ["127.0.0.1:3269"]
      targetTool: tgt
      tgtControlSocket: "$STATE/tgtd/tgtd.socket"
      targetPrefix: iqn.2026-01.dev.spindle.e2e
      initiatorPrefix: iqn.2026-01.dev.spindle.e2e.node
      attachMode: userspace
      stateDir: "$STATE/iscsi/state"
YAML
fi
phase backends $((SECONDS - t))

t=$SECONDS
if ! POOL_FS=xfs SPINDLE_CONFIG=$config DEPLOY=process "$HERE/up.sh"; then
  echo "e2e-storage: the cluster did not come up; last lines of its logs:"
  tail -n 5 "$LOGS"/*.log 2>/dev/null
  exit 1
fi
for img in "$STATE"/images/*.tar; do ctr -n k8s.io images import "$img" >/dev/null || exit 1; done
if wants_ceph; then
  kubectl -n kube-system create secret generic spindle-e2e-rbd --from-literal=userID=admin \
    --from-file=userKey="$STATE/ceph/admin.key" >/dev/null || exit 1
fi
phase up $((SECONDS - t))

# --- one suite run per testdriver, its class paths made absolute.
failed_runs=0
summary=()
for d in $DRIVERS; do
  focus='External.Storage'
  skip=$SKIP
  if [ "$d" = rbd-static ]; then
    # Pre-provisioned PVs in ceph-csi's static form, naming images the
    # driver makes (and removes) with the rbd CLI in the Ceph above, with
    # the rbd class's node-stage secret.
    suite=$BIN/spindle-storage.test
    args=(--spindle.ceph-conf="$STATE/ceph/ceph.conf" --spindle.rbd-command="$RBD_COMMAND" --spindle.rbd-cluster-id="$RBD_CLUSTER"
      --spindle.rbd-pool="$RBD_POOL" --spindle.node-stage-secret-name=spindle-e2e-rbd)
    focus='External.Storage.*Pre-provisioned PV'
  else
    src=$REPO/e2e/storage/testdrivers/$d.yaml
    [ -f "$src" ] || { echo "e2e-storage: no testdriver $src"; failed_runs=$((failed_runs + 1)); continue; }
    sed "s#FromFile: classes/#FromFile: $REPO/e2e/storage/classes/#" "$src" >"$STATE/testdrivers/$d.yaml"
    suite=$BIN/e2e.test
    args=(--storage.testdriver="$STATE/testdrivers/$d.yaml")
    # loop-ext4, the default class, runs every pattern it serves; the xfs
    # and block classes run only their own patterns (with online
    # expansion, which ext4 cannot do here).
    case $d in
    loop-block) focus='External.Storage.*\(block volmode\)' ;;
    loop-xfs) focus='External.Storage.*\(xfs\)' ;;
    esac
  fi
  t=$SECONDS
  log=$STATE/reports/$d.log
  "$BIN/ginkgo" -p --procs="$PROCS" --focus="$focus" --skip="$skip" --timeout=3h --no-color \
    --output-dir="$STATE/reports" --junit-report="$d.xml" "$suite" -- \
    --kubeconfig="$KUBECONFIG" "${args[@]}" >"$log" 2>&1
  rc=$?
  if [ "$d" = rbd-static ]; then
    # Every image the run made must be gone (the driver checks each one;
    # this also catches a test that stopped before its cleanup).
    if ! left=$(static_images_left); then
      echo "e2e-storage (rbd-static): cannot list pool $RBD_POOL"
      rc=1
    elif [ -n "$left" ]; then
      echo "e2e-storage (rbd-static): images left in pool $RBD_POOL:"
      sed 's/^/  /' <<<"$left"
      rc=1
    else
      echo "e2e-storage (rbd-static): pool $RBD_POOL (and its trash) holds no e2e-static-* image"
    fi
  fi
  ran=$(grep -E '^Ran [0-9]+ of [0-9]+ Specs' "$log" | tail -1)
  result=$(grep -E '(SUCCESS|FAIL)! -- ' "$log" | tail -1)
  line="e2e-storage ($d): ${ran:-no summary} -- ${result:-see $log}"
  echo "$line"
  grep -E '^\s*\[FAIL\]' "$log" | sed 's/^/  /' | sort -u
  summary+=("$line")
  [ "$rc" -eq 0 ] && [ -n "$ran" ] || failed_runs=$((failed_runs + 1))
  phase "suite ($d)" $((SECONDS - t))
done

echo "e2e-storage: logs and JUnit reports in $STATE/reports"
printf '%s\n' "${summary[@]}"
if [ "$failed_runs" -gt 0 ]; then
  KEEP=1 "$HERE/down.sh" >/dev/null 2>&1
  rm -rf "$STATE/cluster" && mv "$CLUSTER_DIR" "$STATE/cluster"
  echo "e2e-storage: $failed_runs of $(wc -w <<<"$DRIVERS") runs failed; the cluster's logs are in $STATE/cluster/logs"
  exit 1
fi
