# Shared by the scripts that run Go test packages against a cluster
# (hack/local-cluster, hack/kind-e2e.sh); sourced, not run.
# shellcheck shell=bash disable=SC2034
# count_results FILE: sets passed and failed from `go test -v` output in
# FILE. A package that did not build, panicked or skipped a test counts as
# one more failure: a test that cannot run here must not pass silently.
count_results() {
  local skipped
  passed=$(grep -c '^--- PASS' "$1")
  failed=$(grep -c '^--- FAIL' "$1")
  skipped=$(grep -c '^--- SKIP' "$1")
  if ! grep -q '^\(ok\|FAIL\)' "$1" || [ "$skipped" -gt 0 ] || [ $((passed + failed)) -eq 0 ]; then
    failed=$((failed + skipped + 1))
  fi
  # A package that failed with no test failing: its binary was killed, or
  # timed out, in the middle of a test that never reported.
  if [ "$failed" -eq 0 ] && grep -q '^FAIL' "$1"; then
    failed=1
  fi
}
