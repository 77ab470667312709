#!/usr/bin/env bash
# `make e2e`: builds the cluster's binaries (cached) and the driver, brings
# the local cluster up, runs the Kubernetes e2e tests (e2e/kubernetes)
# against it, and always brings it down. Prints each phase's time and a
# closing line "N passed, M failed"; exits non-zero if any test failed or
# the cluster could not start.
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
trap '"$HERE/down.sh"' EXIT
t=$SECONDS
if ! "$HERE/up.sh"; then
  echo "e2e: the cluster did not come up; last lines of its logs:"
  tail -n 5 "$LOGS"/*.log 2>/dev/null
  echo "0 passed, 1 failed"
  KEEP=1 "$HERE/down.sh" >/dev/null
  trap - EXIT
  exit 1
fi
phase up $((SECONDS - t))

t=$SECONDS
out=$(mktemp)
SPINDLE_E2E_CLUSTER_DIR=$CLUSTER_DIR SPINDLE_E2E_NODE=$NODE \
  go test -count=1 -v -timeout 30m ./e2e/kubernetes/ 2>&1 | tee "$out"
phase tests $((SECONDS - t))
passed=$(grep -c '^--- PASS' "$out")
failed=$(grep -c '^--- FAIL' "$out")
skipped=$(grep -c '^--- SKIP' "$out")
if ! grep -q '^\(ok\|FAIL\)' "$out" || [ "$skipped" -gt 0 ]; then
  # The package did not build, panicked, or skipped: count it as a failure.
  failed=$((failed + skipped + (passed + failed == 0 ? 1 : 0)))
fi
rm -f "$out"
if [ "$failed" -gt 0 ]; then
  echo "e2e: the cluster's logs are in $LOGS until it is brought down"
fi
t=$SECONDS
"$HERE/down.sh"
trap - EXIT
phase down $((SECONDS - t))
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
