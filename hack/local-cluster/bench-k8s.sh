#!/usr/bin/env bash
# `make bench-k8s`: Spindle at scale on the local cluster. Builds the
# cluster's binaries (cached), the driver and the benchmark
# (e2e/cmd/spindle-bench-k8s), brings the cluster up with Spindle installed
# by its Helm chart (DEPLOY=helm: the chart's default sidecar settings, as
# users get them), runs 100 pods without volumes (the baseline), then
# applies 100 PVCs and 100 pods at once and prints how long
# everything took (arguments go to the benchmark: -pods, -size, ...; see
# `go run ./e2e/cmd/spindle-bench-k8s -h`), then brings the cluster up again
# with kube-controller-manager's client limits raised to KCM_QPS (default
# 100; empty skips it) and runs the volumes again: upstream's 20 requests a
# second are what binds claims and creates VolumeAttachments, and the second
# run shows what that limit costs. It always brings the cluster down.
# It prints figures and asserts nothing about time; it exits non-zero only
# when something did not work (a pod that never ran, a volume that was
# not deleted, a cluster that did not come up). A failed run's logs stay in
# $CLUSTER_DIR.failed-bench until the next run.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/local-cluster/env.sh
. "$HERE/env.sh"
export CLUSTER_DIR
cd "$REPO" || exit 1
DEPLOY=${DEPLOY:-helm}
phase() { echo "bench-k8s: $1 took $(($2))s"; }

t=$SECONDS
"$REPO/hack/install-deps.sh" || exit 1
"$HERE/build.sh" || { echo "bench-k8s: building the cluster failed"; exit 1; }
make --no-print-directory build >/dev/null || exit 1
go build -o "$REPO/bin/spindle-bench-k8s" ./e2e/cmd/spindle-bench-k8s || exit 1
phase build $((SECONDS - t))

"$HERE/down.sh" >/dev/null 2>&1 # a cluster a killed run left behind
rm -rf "$CLUSTER_DIR".failed-bench
trap '"$HERE/down.sh" >/dev/null' EXIT
t=$SECONDS
if ! DEPLOY=$DEPLOY "$HERE/up.sh"; then
  echo "bench-k8s: the cluster did not come up; last lines of its logs:"
  tail -n 5 "$LOGS"/*.log 2>/dev/null
  exit 1
fi
phase "up ($DEPLOY)" $((SECONDS - t))

# The baseline first: the same pods without volumes show what the cluster
# itself (scheduler, kubelet, containerd, the pod network) takes to run
# them on this machine, the floor of the figures with volumes.
echo
"$REPO/bin/spindle-bench-k8s" -cluster-dir "$CLUSTER_DIR" -namespace spindle-bench-baseline "$@" -volumes=false
rc=$?
echo
if [ "$rc" -eq 0 ]; then
  "$REPO/bin/spindle-bench-k8s" -cluster-dir "$CLUSTER_DIR" "$@"
  rc=$?
  echo
fi

KCM_QPS=${KCM_QPS-100}
if [ "$rc" -eq 0 ] && [ -n "$KCM_QPS" ]; then
  t=$SECONDS
  "$HERE/down.sh" >/dev/null
  if ! CONTROLLER_MANAGER_QPS=$KCM_QPS DEPLOY=$DEPLOY "$HERE/up.sh" >/dev/null; then
    echo "bench-k8s: the cluster did not come up again (CONTROLLER_MANAGER_QPS=$KCM_QPS)"
    exit 1
  fi
  phase "up again, kube-controller-manager --kube-api-qps $KCM_QPS --kube-api-burst $((KCM_QPS * 2))" $((SECONDS - t))
  echo
  echo "bench-k8s: the same volumes with kube-controller-manager's client limits raised from 20 (burst 30) to $KCM_QPS (burst $((KCM_QPS * 2)))"
  "$REPO/bin/spindle-bench-k8s" -cluster-dir "$CLUSTER_DIR" "$@"
  rc=$?
  echo
fi

t=$SECONDS
trap - EXIT
if [ "$rc" -ne 0 ]; then
  KEEP=1 "$HERE/down.sh"
  mv "$CLUSTER_DIR" "$CLUSTER_DIR.failed-bench" 2>/dev/null &&
    echo "bench-k8s: the cluster's logs are kept in $CLUSTER_DIR.failed-bench (logs, podlogs)"
else
  "$HERE/down.sh"
fi
phase down $((SECONDS - t))
exit "$rc"
