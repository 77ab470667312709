#!/bin/bash
# Runs in the guest (hack/vm/vmtest.sh copies it into the shared directory
# as run.sh): every run of ./plan, "RUN <label> <binary> <regexp> [VAR=value...]",
# its output in out/<label>.log and its verdict in out/<label>.result: pass,
# or why not. A skipped test fails the run: here nothing may be missing.
set -u
cd "$(dirname "$0")" || exit 1
SHARE=$PWD
export PATH="$PATH:/usr/sbin:/sbin" LC_ALL=C
# rbd and ceph stand-ins (hack/vm/cephproxy): with SPINDLE_CEPH_PROXY in a
# run's variables, its cluster-side calls run on the host.
[ -d "$SHARE/bin/ceph-standins" ] && PATH="$SHARE/bin/ceph-standins:$PATH"
SPINDLE_CSI_SANITY=$(ls "$SHARE"/bin/csi-sanity-*/csi-sanity 2>/dev/null | head -1)
export SPINDLE_CSI_SANITY SPINDLE_REPORT_DIR=$SHARE/out/reports
[ -f ceph/services.env ] && { set -a; . ceph/services.env; set +a; }
# The host's Ceph monitor, for rbdtest (services.env names it).
export SPINDLE_CEPH_MON=${SPINDLE_CEPH_MON:-${CEPH_MON:-}}
declare -A dirs=(
  [iscsi]=internal/backend/iscsi [sanity-iscsi]=e2e/sanity/iscsi [lifecycle]=e2e/lifecycle
  [rbd]=internal/backend/rbd [sanity-rbd]=e2e/sanity/rbd [rbd-e2e]=e2e/rbd
  [datapath-iscsi]=e2e/datapath/iscsi [datapath-rbd]=e2e/datapath/rbd [datapath-loop]=e2e/datapath/loop
)
echo "guest: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print $2 / 1024 " MiB"}' /proc/meminfo)"
rc=0
while read -r _ label binary regexp vars; do
  log=$SHARE/out/$label.log
  start=$(date +%s)
  # A benchmark runs once (its own runs and medians are inside it) and
  # passes by printing its figures; a test passes by its --- PASS lines.
  select=(-test.run "$regexp") passed='^--- PASS'
  if [[ $regexp == '^Benchmark'* ]]; then
    select=(-test.run '^$' -test.bench "$regexp" -test.benchtime 1x) passed='^datapath '
  fi
  # shellcheck disable=SC2086 # vars is a list of VAR=value words
  (cd "$SHARE/repo/${dirs[$binary]}" && env $vars "$SHARE/bin/$binary.test" -test.v -test.count=1 \
    -test.timeout=60m "${select[@]}") >"$log" 2>&1
  status=$?
  took=$(($(date +%s) - start))
  pass=$(grep -c -- "$passed" "$log") fail=$(grep -c -- '^--- FAIL' "$log") skip=$(grep -E -c -- '^\s*--- SKIP' "$log")
  if [ "$status" -eq 0 ] && [ "$pass" -gt 0 ] && [ "$skip" -eq 0 ]; then
    echo pass >"$SHARE/out/$label.result"
  else
    echo "exit $status, $pass passed, $fail failed, $skip skipped" >"$SHARE/out/$label.result"
    grep -E -A3 -- '--- (FAIL|SKIP)' "$log" | head -40
    rc=1
  fi
  echo "guest: $label: $(cat "$SHARE/out/$label.result") (${took}s)"
  # Stage and unstage latency on this kernel, per driver the run started
  # (e2e/harness logs each method's p50 when a test ends).
  grep -oE 'rpc Node(Stage|Unstage)Volume: .*' "$log" | sed "s|^|$label: |" >>"$SHARE/out/reports/rpc-latency.txt"
done <"$SHARE/plan"
exit $rc
