#!/usr/bin/env bash
# `make e2e`: builds the cluster's binaries (cached) and the driver, then for
# each deployment in DEPLOYS (default "process helm": the driver and
# sidecars as host processes, then installed by `helm install charts/spindle`)
# brings the local cluster up, runs the Kubernetes e2e tests (e2e/kubernetes)
# against it, and always brings it down. Prints each phase's time and a
# closing line "N passed, M failed"; exits non-zero if any test failed or a
# cluster could not start. A failed run's logs stay in
# $CLUSTER_DIR.failed-<deploy> until the next run.
#
# With the driver as host processes, the driver also has an rbd backend on a
# throw-away Ceph (hack/ceph-up.sh, under $CEPH_STATE, default
# /var/tmp/spindle-e2e-ceph) that it reaches only through a cluster map in
# ceph-csi's format, as Rook writes it: the tests of what Rook users bring
# (e2e/kubernetes/rook_test.go) use it. E2E_RUN, when set, is go test's
# -run (only those tests).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/local-cluster/env.sh
. "$HERE/env.sh"
export CLUSTER_DIR
cd "$REPO" || exit 1
phase() { echo "e2e: $1 took $(($2))s"; }

t=$SECONDS
"$REPO/hack/install-deps.sh" || exit 1
"$HERE/build.sh" || { echo "e2e: building the cluster failed"; echo "0 passed, 1 failed"; exit 1; }
make --no-print-directory build >/dev/null || { echo "0 passed, 1 failed"; exit 1; }
phase build $((SECONDS - t))

CEPH_STATE=${CEPH_STATE:-/var/tmp/spindle-e2e-ceph}
# ceph_down: the rbd-fuse mounts the driver left (none after a clean run),
# then the Ceph daemons.
ceph_down() {
  grep " $CEPH_STATE/" /proc/self/mountinfo | awk '{print $5}' | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
  "$REPO/hack/ceph-down.sh" "$CEPH_STATE/ceph" >/dev/null 2>&1
}
# ceph_up: a throw-away Ceph, the driver's configuration with it (the loop
# pool stays the default backend) and what the tests need to reach it.
ceph_up() {
  ceph_down
  rm -rf "$CEPH_STATE" && mkdir -p "$CEPH_STATE/csi-config"
  # The driver as host processes links this machine's Ceph 16 libraries
  # (and its rbd-fuse mounter runs this machine's qemu-storage-daemon),
  # which need a key of the older cipher; the chart's pods and kind run
  # the image's Ceph 20 client with Tentacle's default keys.
  ADMIN_KEY_CIPHER=aes MON_PORT=3391 MON_V1_PORT=6798 "$REPO/hack/ceph-up.sh" "$CEPH_STATE/ceph" replicapool >"$CEPH_STATE/ceph-up.log" 2>&1 ||
    { echo "e2e: Ceph did not start:"; tail -5 "$CEPH_STATE/ceph-up.log"; return 1; }
  (umask 077 && sed -n 's/^[[:space:]]*key = //p' "$CEPH_STATE/ceph/ceph.client.admin.keyring" >"$CEPH_STATE/admin.key") || return 1
  [ -s "$CEPH_STATE/admin.key" ] || { echo "e2e: no admin key in $CEPH_STATE/ceph"; return 1; }
  # Rook's rook-ceph-csi-config ConfigMap (key csi-cluster-config-json),
  # as a file; the driver's config names no monitor of its own.
  cat >"$CEPH_STATE/csi-config/config.json" <<JSON
[{"clusterID":"rook-ceph","monitors":["127.0.0.1:3391"],"namespace":"rook-ceph","rbd":{"netNamespaceFilePath":"","radosNamespace":""}}]
JSON
  cat >"$CEPH_STATE/spindle.yaml" <<YAML
defaultBackend: loop/default
backends:
  - type: loop
    name: default
    loop:
      poolDir: "$POOL_DIR"
  - type: rbd
    name: rook
    rbd:
      clusterID: rook-ceph
      clusterMap: "$CEPH_STATE/csi-config/config.json"
      pool: replicapool
      userID: admin
      keyFile: "$CEPH_STATE/admin.key"
      mounter: rbd-fuse
      fuseDir: "$CEPH_STATE/rbd-fuse"
YAML
  export SPINDLE_CONFIG=$CEPH_STATE/spindle.yaml SPINDLE_E2E_CEPH_CONF=$CEPH_STATE/ceph/ceph.conf \
    SPINDLE_E2E_CEPH_POOL=replicapool SPINDLE_E2E_CEPH_CLUSTER_ID=rook-ceph SPINDLE_E2E_CONTROLLER_URL=http://127.0.0.1:9808 \
    SPINDLE_E2E_CLUSTER_MAP=$CEPH_STATE/csi-config/config.json SPINDLE_E2E_CEPH_MON_V1=v1:127.0.0.1:6798
}

"$HERE/down.sh" >/dev/null 2>&1 # a cluster a killed run left behind
ceph_down
rm -rf "$CLUSTER_DIR".failed-*
trap '"$HERE/down.sh" >/dev/null; ceph_down' EXIT
total_passed=0 total_failed=0
# DEPLOYS: the driver as host processes, then installed by charts/spindle.
for deploy in ${DEPLOYS:-process helm}; do
  t=$SECONDS
  unset SPINDLE_CONFIG SPINDLE_E2E_CEPH_CONF SPINDLE_E2E_CEPH_POOL SPINDLE_E2E_CEPH_CLUSTER_ID SPINDLE_E2E_CONTROLLER_URL \
    SPINDLE_E2E_CLUSTER_MAP SPINDLE_E2E_CEPH_MON_V1
  if [ "$deploy" = process ] && ! ceph_up; then
    total_failed=$((total_failed + 1))
    continue
  fi
  if ! DEPLOY=$deploy "$HERE/up.sh"; then
    echo "e2e[$deploy]: the cluster did not come up; last lines of its logs:"
    tail -n 5 "$LOGS"/*.log 2>/dev/null
    "$HERE/down.sh" >/dev/null
    total_failed=$((total_failed + 1))
    continue
  fi
  # PostgreSQL for the Rook test (TestRookStorageClassUnchanged), with
  # the Ceph it runs on.
  if [ "$deploy" = process ] && ! { IMAGES_DIR=$CLUSTER_DIR/images "$REPO/hack/images.sh" postgres >/dev/null &&
    ctr -n k8s.io images import "$CLUSTER_DIR/images/postgres.tar" >/dev/null; }; then
    echo "e2e[$deploy]: assembling the PostgreSQL image failed"
    total_failed=$((total_failed + 1))
  fi
  phase "up ($deploy)" $((SECONDS - t))

  t=$SECONDS
  out=$(mktemp)
  packages=(./e2e/kubernetes/)
  # With the chart deployed, also the chart's tests that need a cluster:
  # every rendering through the apiserver's dry run, every sidecar flag
  # known to the sidecar binaries.
  [ "$deploy" = helm ] && packages+=(./e2e/chart/)
  # The tests reach the driver's endpoints through the API server's pod
  # proxy; the driver as host processes has no pods, so they are given its
  # address, and the operators' view through the proxy does not apply.
  # The chart's pods do not reach the Ceph on this machine's loopback: the
  # Rook tests run with the driver as host processes only.
  skip=(-skip '^(TestAdoptCephCSIVolume|TestMonitorMoveNeedsNoRestart|TestRookStorageClassUnchanged)$') direct=()
  if [ "$deploy" = process ]; then
    skip=(-skip '^TestOperatorViewThroughAPIServerProxy$')
    direct=(SPINDLE_E2E_NODE_ADDRESS="$NODE=127.0.0.1:9808" SPINDLE_E2E_CONTROLLER_URL=http://127.0.0.1:9808)
  fi
  run=()
  [ -n "${E2E_RUN:-}" ] && run=(-run "$E2E_RUN")
  env "${direct[@]}" SPINDLE_E2E_KUBECONFIG="$KUBECONFIG" SPINDLE_E2E_NODE="$NODE" SPINDLE_HELM="$("$REPO/hack/helm.sh")" \
    go test -count=1 -v -timeout 30m -tags cluster "${skip[@]}" "${run[@]}" "${packages[@]}" 2>&1 | tee "$out"
  phase "tests ($deploy)" $((SECONDS - t))
  count_results "$out"
  rm -f "$out"
  echo "e2e[$deploy]: $passed passed, $failed failed"
  total_passed=$((total_passed + passed)) total_failed=$((total_failed + failed))

  t=$SECONDS
  if [ "$failed" -gt 0 ]; then
    KEEP=1 "$HERE/down.sh"
    echo "e2e[$deploy]: the cluster's logs are kept in $LOGS and $CLUSTER_DIR/podlogs"
    mv "$CLUSTER_DIR" "$CLUSTER_DIR.failed-$deploy" 2>/dev/null || true
  else
    "$HERE/down.sh"
  fi
  ceph_down
  phase "down ($deploy)" $((SECONDS - t))
done
trap - EXIT
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
