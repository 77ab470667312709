#!/usr/bin/env bash
# `make e2e`: builds the cluster's binaries (cached) and the driver, then for
# each deployment in DEPLOYS (default "process helm": the driver and
# sidecars as host processes, then installed by `helm install charts/spindle`)
# brings the local cluster up, runs the Kubernetes e2e tests (e2e/kubernetes)
# against it, and always brings it down. Prints each phase's time and a
# closing line "N passed, M failed"; exits non-zero if any test failed or a
# cluster could not start. A failed run's logs stay in
# $CLUSTER_DIR.failed-<deploy> until the next run.
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

"$HERE/down.sh" >/dev/null 2>&1 # a cluster a killed run left behind
rm -rf "$CLUSTER_DIR".failed-*
trap '"$HERE/down.sh" >/dev/null' EXIT
total_passed=0 total_failed=0
# DEPLOYS: the driver as host processes, then installed by charts/spindle.
for deploy in ${DEPLOYS:-process helm}; do
  t=$SECONDS
  if ! DEPLOY=$deploy "$HERE/up.sh"; then
    echo "e2e[$deploy]: the cluster did not come up; last lines of its logs:"
    tail -n 5 "$LOGS"/*.log 2>/dev/null
    "$HERE/down.sh" >/dev/null
    total_failed=$((total_failed + 1))
    continue
  fi
  phase "up ($deploy)" $((SECONDS - t))

  t=$SECONDS
  out=$(mktemp)
  packages=(./e2e/kubernetes/)
  # With the chart deployed, also the chart's tests that need a cluster:
  # every rendering through the apiserver's dry run, every sidecar flag
  # known to the sidecar binaries.
  [ "$deploy" = helm ] && packages+=(./e2e/chart/)
  # The operators' view through the API server's pod proxy needs the
  # chart's pods; with the driver as host processes there are none.
  skip=()
  [ "$deploy" = process ] && skip=(-skip '^TestOperatorViewThroughAPIServerProxy$')
  SPINDLE_E2E_CLUSTER_DIR=$CLUSTER_DIR SPINDLE_E2E_NODE=$NODE SPINDLE_HELM=$("$REPO/hack/helm.sh") \
    go test -count=1 -v -timeout 30m "${skip[@]}" "${packages[@]}" 2>&1 | tee "$out"
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
  phase "down ($deploy)" $((SECONDS - t))
done
trap - EXIT
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
