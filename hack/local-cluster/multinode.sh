#!/usr/bin/env bash
# `make e2e-multinode`: the local cluster with two worker nodes that are qemu
# guests (hack/local-cluster/workers.sh: their own Debian kernels, so krbd and
# the iSCSI kernel initiator run for real), Ceph and tgtd on this machine in
# the guests' network (hack/vm/services.sh), Spindle installed from
# charts/spindle with the chart's node defaults and a StorageClass per
# attach mode (RBD: krbd, encrypted krbd, rbd-nbd, rbd-fuse; iSCSI with
# CHAP: kernel initiator, userspace; loop), then the
# multi-node tests (e2e/multinode). The workers get no share of the iSCSI
# pools: like real nodes, they reach the target's portal; they mount the
# loop pool (9p), the shared storage the loop backend needs.
# Always tears it all down; a failed run's logs stay in
# $CLUSTER_DIR.failed-multinode until the next run. Prints each phase's
# time, the machine's peak memory in use and "N passed, M failed".
#
#   hack/local-cluster/multinode.sh [all]   everything, as `make e2e-multinode`
#   hack/local-cluster/multinode.sh up      bring it up and leave it running
#       (then: go test ./e2e/multinode/ with the SPINDLE_E2E_* it prints)
#   hack/local-cluster/multinode.sh install (re)install the chart on it
#   hack/local-cluster/multinode.sh down    stop it all
#   TESTS=REGEXP (optional): only the tests go test -run REGEXP selects
#       (Go splits REGEXP at a top-level | before its /: parenthesize
#       alternatives, e.g. 'Test(NodePluginRestart|HelmUpgrade)KeepsIO/userspace')
#   SKIP=REGEXP (optional): not the tests go test -skip REGEXP leaves out
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/local-cluster/env.sh
. "$HERE/env.sh"
# shellcheck source=hack/vm/lib.sh
. "$REPO/hack/vm/lib.sh"
export CLUSTER_DIR
SERVICES=$CLUSTER_DIR/services
ISCSI_POOL=$CLUSTER_DIR/iscsi-pool
ISCSI_USER_POOL=$CLUSTER_DIR/iscsi-pool-userspace
# The loop backend's pool: the controller's here, the workers' over 9p at
# the same path (a shared filesystem, as the loop backend needs).
LOOP_POOL=$CLUSTER_DIR/loop-pool
# The previous release, chart 0.1.0 and its driver: main as it was last
# before chart 0.2.0 (attach daemon, host network by default).
# TestUpgradeFromPreviousChart moves the release there and upgrades it
# back with volumes in use. Built from this commit of the repository's
# history; without it (a shallow clone) that test skips.
PREVIOUS_RELEASE=${PREVIOUS_RELEASE:-45c383febf2fba127acd3839280c88eeb759ccb1}
PREVIOUS_SRC=$CLUSTER_DIR/previous-release
WORKER_NAMES=()
for ((i = 1; i <= ${WORKERS:-2}; i++)); do WORKER_NAMES+=("spindle-worker-$i"); done
cd "$REPO" || exit 1
phase() { echo "multinode: $1 took $(($2))s"; }

# memory_sampler FILE: every 2 s, the machine's memory in use (MemTotal -
# MemAvailable, MiB: the control plane, Ceph, tgtd and the workers' qemu)
# and the workers' qemu RSS; FILE ends up with the peaks.
memory_sampler() {
  local peak=0 qpeak=0 used q
  while :; do
    used=$(awk '/^MemTotal/{t=$2} /^MemAvailable/{a=$2} END{print int((t-a)/1024)}' /proc/meminfo)
    q=$(ps -C qemu-system-x86_64 -o rss= 2>/dev/null | awk '{s+=$1} END{print int(s/1024)}')
    ((used > peak)) && peak=$used
    ((q > qpeak)) && qpeak=$q
    echo "$peak $qpeak" >"$1"
    sleep 2
  done
}

# rbd_class NAME SECRET [PARAMETER...]: the values of a StorageClass NAME
# on backend rbd/ceph, ext4, its CSI secrets SECRET's, with more
# parameters ("key: value": a mounter other than the backend's krbd, as
# ceph-csi's classes name one, or encryption).
rbd_class() {
  local name=$1 secret=$2 p op
  shift 2
  printf '  - name: %s\n    parameters:\n      backend: rbd/ceph\n      csi.storage.k8s.io/fstype: ext4\n' "$name"
  for p in "$@"; do printf '      %s\n' "$p"; done
  for op in provisioner controller-publish node-stage controller-expand; do
    printf '      csi.storage.k8s.io/%s-secret-name: %s\n' "$op" "$secret"
    printf '      csi.storage.k8s.io/%s-secret-namespace: kube-system\n' "$op"
  done
  printf '    allowVolumeExpansion: true\n'
}

# install_chart: Spindle from charts/spindle, the controller on this
# machine's node, the node plugin on the workers; waits for both workers'
# registrations. The node plugin runs with the chart's defaults (host
# network, the host's kernel paths, the attach daemon); a StorageClass per
# attach mode (rbd-nbd and rbd-fuse are classes of the krbd backend with
# ceph-csi's mounter parameter).
install_chart() {
  # shellcheck source=/dev/null
  . "$SERVICES/services.env"
  kubectl -n kube-system create secret generic spindle-ceph --dry-run=client -o yaml \
    --from-literal=userID="$CEPH_USER" --from-literal=userKey="$CEPH_KEY" | kubectl apply -f - >/dev/null
  kubectl -n kube-system create secret generic spindle-ceph-controller --dry-run=client -o yaml \
    --from-literal=key="$CEPH_KEY" | kubectl apply -f - >/dev/null
  # The iSCSI volumes' CHAP credentials: the target's account (the
  # controller's publish) and the workers' login (their stage).
  kubectl -n kube-system create secret generic spindle-iscsi-chap --dry-run=client -o yaml \
    --from-literal=node.session.auth.username=spindle-multinode \
    --from-literal=node.session.auth.password=multinode-chap-1 | kubectl apply -f - >/dev/null
  # The encrypted class's Secret: the cephx user and the built-in KMS's
  # encryptionPassphrase, which wraps each volume's LUKS passphrase. Made
  # once per cluster: a new one would not unwrap the volumes' keys.
  kubectl -n kube-system get secret spindle-ceph-encrypted >/dev/null 2>&1 ||
    kubectl -n kube-system create secret generic spindle-ceph-encrypted --from-literal=userID="$CEPH_USER" \
      --from-literal=userKey="$CEPH_KEY" --from-literal=encryptionPassphrase="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >/dev/null
  VALUES=$CLUSTER_DIR/multinode-values.yaml
  # The chart's node defaults: no hostNetwork, no host directories here.
  # The node plugin registers itself (no node-driver-registrar image here).
  write_values "$VALUES" dev 'node:
  registration: driver
  nodeSelector: {spindle.csi.dev/worker: "true"}'
  # Chart 0.1.0's node plugin ran in the pod network by default, and the
  # kernel paths needed the host's directories by hand: these are the
  # values make e2e-multinode gave it.
  write_values "$CLUSTER_DIR/previous-values.yaml" previous 'node:
  hostNetwork: true
  registration: driver
  nodeSelector: {spindle.csi.dev/worker: "true"}
  extraVolumes:
    - name: lib-modules
      hostPath: {path: /lib/modules, type: Directory}
    - name: etc-iscsi
      hostPath: {path: /etc/iscsi, type: Directory}
    - name: iscsi-lock
      hostPath: {path: /run/lock/iscsi, type: DirectoryOrCreate}
    - name: iscsi-state
      hostPath: {path: /run/spindle/iscsi, type: DirectoryOrCreate}
  extraVolumeMounts:
    - {name: lib-modules, mountPath: /lib/modules, readOnly: true}
    - {name: etc-iscsi, mountPath: /etc/iscsi}
    - {name: iscsi-lock, mountPath: /run/lock/iscsi}
    - {name: iscsi-state, mountPath: /run/spindle/iscsi, mountPropagation: Bidirectional}'
  "$("$REPO/hack/helm.sh")" upgrade --install spindle "$REPO/charts/spindle" --namespace kube-system -f "$VALUES" \
    --wait --timeout 5m >/dev/null || return 1
  local w
  for w in "${WORKER_NAMES[@]}"; do
    for _ in $(seq 1 240); do registered_on "$w" && continue 2; sleep 0.5; done
    echo "multinode: the node plugin did not register on $w" >&2
    return 1
  done
}

# write_values FILE TAG NODE: the release's values, with the driver image
# local.test/spindle:TAG and NODE as the node section.
write_values() {
  local tag=$2 node=$3
  cat >"$1" <<YAML
# Generated by hack/local-cluster/multinode.sh: the controller on this
# machine's node, the node plugin on the guest workers.
imagePullPolicy: Never
apiServer: {host: $VM_UPLINK_HOST_IP, port: 6443}
driver:
  image: {repository: local.test/spindle, tag: $tag}
  metrics: {bindAddress: ""}
  # Every command the driver runs, with its time: the tests read the
  # fencing timeline (ceph osd blocklist add) from the controller's log.
  logLevel: debug
config:
  defaultBackend: rbd/ceph
  backends:
    - type: rbd
      name: ceph
      rbd:
        clusterID: ceph
        monitors: ["$CEPH_MON"]
        pool: $CEPH_POOL
        userID: $CEPH_USER
        keyFile: /etc/spindle/ceph/key
        mounter: krbd
        fencing: true
    - type: iscsi
      name: tgt
      iscsi:
        poolDir: $ISCSI_POOL
        portals: ["$TGT_PORTAL"]
        targetTool: tgt
        tgtControlSocket: $TGT_SOCKET
        targetPrefix: iqn.2026-01.dev.spindle
        initiatorPrefix: iqn.2026-01.dev.spindle.node
        attachMode: kernel
        stateDir: /run/spindle/iscsi
    - type: iscsi
      name: tgt-user
      iscsi:
        poolDir: $ISCSI_USER_POOL
        portals: ["$TGT_PORTAL"]
        targetTool: tgt
        tgtControlSocket: $TGT_SOCKET
        targetPrefix: iqn.2026-01.dev.spindle.user
        initiatorPrefix: iqn.2026-01.dev.spindle.user-node
        attachMode: userspace
        stateDir: /run/spindle/iscsi-user
    - type: loop
      name: shared
      loop:
        poolDir: $LOOP_POOL
controller:
  hostNetwork: true
  nodeSelector: {kubernetes.io/hostname: $NODE}
  extraVolumes:
    - name: ceph-key
      secret: {secretName: spindle-ceph-controller, items: [{key: key, path: key}]}
    - name: tgtd
      hostPath: {path: $(dirname "$TGT_SOCKET"), type: Directory}
  extraVolumeMounts:
    - {name: ceph-key, mountPath: /etc/spindle/ceph, readOnly: true}
    - {name: tgtd, mountPath: $(dirname "$TGT_SOCKET")}
$node
sidecars:
  provisioner: {image: {repository: local.test/csi-provisioner, tag: v6.3.0}}
  attacher: {image: {repository: local.test/csi-attacher, tag: v4.13.0}}
  resizer: {image: {repository: local.test/csi-resizer, tag: v2.3.0}}
  snapshotter: {image: {repository: local.test/csi-snapshotter, tag: v8.7.0}}
  livenessProbe: {enabled: false}
volumeGroupSnapshots: true
snapshotController:
  enabled: true
  hostNetwork: true
  image: {repository: local.test/snapshot-controller, tag: v8.7.0}
storageClasses:
$(rbd_class spindle-rbd spindle-ceph)
$(rbd_class spindle-rbd-encrypted spindle-ceph-encrypted 'encrypted: "true"')
$(rbd_class spindle-rbd-nbd spindle-ceph 'mounter: rbd-nbd')
$(rbd_class spindle-rbd-fuse spindle-ceph 'mounter: rbd-fuse')
  - name: spindle-iscsi
    parameters:
      backend: iscsi/tgt
      csi.storage.k8s.io/fstype: ext4
      csi.storage.k8s.io/controller-publish-secret-name: spindle-iscsi-chap
      csi.storage.k8s.io/controller-publish-secret-namespace: kube-system
      csi.storage.k8s.io/node-stage-secret-name: spindle-iscsi-chap
      csi.storage.k8s.io/node-stage-secret-namespace: kube-system
    allowVolumeExpansion: true
  - name: spindle-iscsi-userspace
    parameters:
      backend: iscsi/tgt-user
      csi.storage.k8s.io/fstype: ext4
      csi.storage.k8s.io/controller-publish-secret-name: spindle-iscsi-chap
      csi.storage.k8s.io/controller-publish-secret-namespace: kube-system
      csi.storage.k8s.io/node-stage-secret-name: spindle-iscsi-chap
      csi.storage.k8s.io/node-stage-secret-namespace: kube-system
    allowVolumeExpansion: true
  - name: spindle-loop
    parameters:
      backend: loop/shared
      csi.storage.k8s.io/fstype: ext4
    allowVolumeExpansion: true
# iSCSI snapshots need no credentials.
volumeSnapshotClasses:
  - name: spindle-iscsi
    deletionPolicy: Delete
YAML
}

registered_on() {
  [ "$(kubectl get csinode "$1" -o jsonpath='{.spec.drivers[?(@.name=="'"$DRIVER_NAME"'")].nodeID}' 2>/dev/null)" = "$1" ]
}

down() {
  "$HERE/workers.sh" down >/dev/null 2>&1
  [ ! -d "$SERVICES" ] || "$REPO/hack/vm/services.sh" down "$SERVICES" >/dev/null 2>&1
  "$HERE/down.sh" >/dev/null
  "$REPO/hack/vm/net.sh" down >/dev/null 2>&1
}
fail() { echo "multinode: $*"; echo "0 passed, 1 failed"; exit 1; }

# up: the control plane, Ceph and tgtd, the images, the workers, the chart.
up() {
  local t=$SECONDS
  DEPLOY=none "$HERE/up.sh" || fail "the control plane did not come up"
  "$REPO/hack/vm/services.sh" up "$SERVICES" || fail "Ceph and tgtd did not come up"
  phase "control plane and services" $((SECONDS - t))

  t=$SECONDS
  local images=$CLUSTER_DIR/images/chart img
  IMAGES_DIR=$images "$REPO/hack/images.sh" all >/dev/null || fail "assembling the images failed"
  for img in "$images"/*.tar; do ctr -n k8s.io images import "$img" >/dev/null; done
  # The workers get the images their pods run (workers.sh links
  # $CLUSTER_DIR/images/*.tar): the driver for the node plugin, the pause
  # image, the tests' pods and PostgreSQL; this machine's node runs the
  # database's clients.
  ln -f "$images/spindle.tar" "$CLUSTER_DIR/images/spindle.tar"
  # The same build under another tag: TestHelmUpgradeKeepsIO upgrades to it
  # (driver.image.tag), the workers' node plugins and this machine's
  # controller alike, so both get it.
  TAG=upgrade IMAGES_DIR=$CLUSTER_DIR/images/upgrade "$REPO/hack/images.sh" driver >/dev/null || fail "assembling the upgrade image failed"
  ln -f "$CLUSTER_DIR/images/upgrade/spindle.tar" "$CLUSTER_DIR/images/spindle-upgrade.tar"
  ctr -n k8s.io images import "$CLUSTER_DIR/images/spindle-upgrade.tar" >/dev/null
  # The previous release's chart and driver image, from its commit.
  rm -rf "$PREVIOUS_SRC"
  if git -C "$REPO" cat-file -e "$PREVIOUS_RELEASE^{commit}" 2>/dev/null; then
    mkdir -p "$PREVIOUS_SRC"
    git -C "$REPO" archive "$PREVIOUS_RELEASE" | tar -x -C "$PREVIOUS_SRC" || fail "extracting the previous release $PREVIOUS_RELEASE failed"
    "$REPO/hack/install-deps.sh" previous-release || fail "installing what the previous release's images.sh copies failed"
    TAG=previous VERSION=${PREVIOUS_RELEASE:0:12} IMAGES_DIR=$CLUSTER_DIR/images/previous "$PREVIOUS_SRC/hack/images.sh" driver >/dev/null ||
      fail "assembling the previous release's driver image failed"
    ln -f "$CLUSTER_DIR/images/previous/spindle.tar" "$CLUSTER_DIR/images/spindle-previous.tar"
    ctr -n k8s.io images import "$CLUSTER_DIR/images/spindle-previous.tar" >/dev/null
  else
    echo "multinode: the previous release's commit $PREVIOUS_RELEASE is not in this clone: TestUpgradeFromPreviousChart will skip"
  fi
  IMAGES_DIR=$CLUSTER_DIR/images "$REPO/hack/images.sh" postgres >/dev/null || fail "assembling the PostgreSQL image failed"
  ctr -n k8s.io images import "$CLUSTER_DIR/images/postgres.tar" >/dev/null
  phase images $((SECONDS - t))

  t=$SECONDS
  # The workers get no share of the iSCSI pools ($ISCSI_POOL and
  # $ISCSI_USER_POOL, the controller's, on this machine): a node has the
  # target's portal, the publish_context and the CHAP secret, as a real
  # node does. The loop pool is shared storage (the loop backend binds its
  # image files on the nodes), so the workers mount it.
  mkdir -p "$LOOP_POOL"
  WORKER_SHARED_DIRS=$LOOP_POOL "$HERE/workers.sh" up "${#WORKER_NAMES[@]}" || fail "the workers did not join"
  phase workers $((SECONDS - t))

  t=$SECONDS
  install_chart || fail "installing the chart failed"
  phase "helm install" $((SECONDS - t))
}

TEST_ENV=(SPINDLE_E2E_CLUSTER_DIR="$CLUSTER_DIR" SPINDLE_E2E_WORKERS="${WORKER_NAMES[*]}"
  SPINDLE_E2E_WORKERS_SCRIPT="$HERE/workers.sh" SPINDLE_HELM="$("$REPO/hack/helm.sh")"
  SPINDLE_E2E_CHART="$REPO/charts/spindle" SPINDLE_E2E_HELM_VALUES="$CLUSTER_DIR/multinode-values.yaml"
  SPINDLE_E2E_PREVIOUS_CHART="$PREVIOUS_SRC/charts/spindle" SPINDLE_E2E_PREVIOUS_VALUES="$CLUSTER_DIR/previous-values.yaml")

case ${1:-all} in
down) down; exit 0 ;;
install) install_chart; exit $? ;;
up | all) ;;
*) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac

t=$SECONDS
"$REPO/hack/install-deps.sh" || exit 1
"$HERE/build.sh" || fail "building the cluster failed"
make --no-print-directory build >/dev/null || fail "building the driver failed"
"$REPO/hack/vm/build.sh" >/dev/null || fail "building the guest failed"
phase build $((SECONDS - t))

down # what a killed run left behind
rm -rf "$CLUSTER_DIR".failed-*
if [ "${1:-all}" = up ]; then
  up
  echo "multinode: up; KUBECONFIG=$KUBECONFIG ${TEST_ENV[*]} go test -tags cluster -parallel 16 ./e2e/multinode/"
  exit 0
fi
memory=$(mktemp)
memory_sampler "$memory" &
sampler=$!
trap 'kill $sampler 2>/dev/null; down' EXIT
up

t=$SECONDS
out=$(mktemp)
env "${TEST_ENV[@]}" go test -count=1 -v -tags cluster -parallel 16 -timeout 150m ${TESTS:+-run "$TESTS"} ${SKIP:+-skip "$SKIP"} ./e2e/multinode/ 2>&1 | tee "$out"
phase tests $((SECONDS - t))
read -r peak qpeak <"$memory"
echo "multinode: peak memory in use on this machine: $peak MiB, of which the workers' qemu: $qpeak MiB"
count_results "$out"
rm -f "$out"
kill "$sampler" 2>/dev/null
rm -f "$memory"
if [ "$failed" -gt 0 ]; then
  trap - EXIT
  KEEP=1 down
  mv "$CLUSTER_DIR" "$CLUSTER_DIR.failed-multinode" 2>/dev/null
  echo "multinode: the cluster's and the workers' logs are kept in $CLUSTER_DIR.failed-multinode"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
