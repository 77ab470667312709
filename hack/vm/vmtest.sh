#!/usr/bin/env bash
# `make vmtest`: the attach paths this machine's kernel lacks, run for real
# in a qemu guest with Debian's own kernel (hack/vm/build.sh): the iSCSI
# kernel initiator against tgtd and against LIO, and RBD through krbd and
# rbd-nbd against a Ceph on this machine (hack/vm/services.sh, reached over
# a tap in a network namespace), plus online ext4 growth.
#
# The test binaries are built here (`go test -c`) and run in the guest from
# a shared directory, each with the environment that selects its mode
# (iscsitest.EnvTarget/EnvAttach, rbdtest.EnvMounter/EnvCephDir,
# sanity.EnvAccess). Every run names its tests: a skipped test is a
# failure here, since the guest is where nothing may be missing.
#
#   VMTEST_DIR   work directory (default /var/tmp/spindle-vmtest; the
#                guest's logs and reports stay in $VMTEST_DIR/share/out)
#   MODES        which modes (default "kernel/tgt kernel/lio krbd rbd-nbd loop")
#   RUNS         an extended regexp: only the runs whose label matches it
#                (e.g. 'sanity-stock|lifecycle'); the labels are
#                <backend>-<what>-<mode>, listed in $VMTEST_DIR/share/plan
#   VMTEST_CEPH_PROXY  "0" runs the guest's cluster-side rbd and ceph calls
#                in the guest too (default: on this machine, hack/vm/cephproxy)
#   DATAPATH     "1" adds each mode's data-path benchmark (e2e/datapath,
#                fio; prints `datapath <mode> ...` lines, and `<mode>+luks`
#                ones for an encrypted volume against a plain one)
#
# Ends with "N passed, M failed" and exits non-zero on any failure.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
VM=$REPO/hack/vm
WORK=${VMTEST_DIR:-/var/tmp/spindle-vmtest}
MODES=${MODES:-kernel/tgt kernel/lio krbd rbd-nbd loop}
SHARE=$WORK/share
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin" LC_ALL=C
cd "$REPO" || exit 1
phase() { echo "vmtest: $1 took $(($2))s"; }

t=$SECONDS
"$REPO/hack/install-deps.sh" || exit 1
"$VM/build.sh" || { echo "vmtest: the guest did not build"; echo "0 passed, 1 failed"; exit 1; }
phase "guest build" $((SECONDS - t))

# --- what the guest runs: test binaries, the scripts they start, csi-sanity.
t=$SECONDS
rm -rf "$SHARE" && mkdir -p "$SHARE/bin" "$SHARE/repo/hack" "$SHARE/out/reports"
declare -A packages=(
  [iscsi]=internal/backend/iscsi [sanity-iscsi]=e2e/sanity/iscsi [lifecycle]=e2e/lifecycle
  [rbd]=internal/backend/rbd [sanity-rbd]=e2e/sanity/rbd [rbd-e2e]=e2e/rbd
  [datapath-iscsi]=e2e/datapath/iscsi [datapath-rbd]=e2e/datapath/rbd [datapath-loop]=e2e/datapath/loop
)
# With the driver's Ceph client (cgo, the tag "ceph"): the guest's own
# Debian 12 librados and librbd serve it there.
tags=$("$REPO/hack/go-tags.sh") || exit 1
for name in "${!packages[@]}"; do
  go test -c -tags "root $tags" -o "$SHARE/bin/$name.test" "./${packages[$name]}" || { echo "vmtest: go test -c ${packages[$name]} failed"; exit 1; }
  mkdir -p "$SHARE/repo/${packages[$name]}"
done
# The tests find the repository by its go.mod and start tgtd with hack/tgtd.sh.
cp go.mod "$SHARE/repo/" && cp hack/tgtd.sh "$SHARE/repo/hack/"
# The guest's rbd and ceph stand-ins (hack/vm/cephproxy): first on the
# guest's PATH; with SPINDLE_CEPH_PROXY set they run everything but
# "rbd device" on this machine.
go build -o "$SHARE/bin/cephproxy" ./hack/vm/cephproxy || exit 1
mkdir -p "$SHARE/bin/ceph-standins" && ln -s ../cephproxy "$SHARE/bin/ceph-standins/rbd" && ln -s ../cephproxy "$SHARE/bin/ceph-standins/ceph"
# In a directory named like the original's: reports name the version by it.
csi_sanity=$("$REPO/hack/csi-sanity.sh") || exit 1
mkdir -p "$SHARE/bin/$(basename "$(dirname "$csi_sanity")")"
cp "$csi_sanity" "$SHARE/bin/$(basename "$(dirname "$csi_sanity")")/csi-sanity" || exit 1
phase "test binaries" $((SECONDS - t))

# RBD's controller services run here, one per mounter (publish_context
# names it), as a cluster runs them away from the nodes: under emulation
# each of their many rbd calls would cost seconds. The guest's sanity
# runs send every Controller RPC to these, over TCP (socat, in the guests'
# network namespace, in front of each controller's unix socket).
declare -A controller_ports=([krbd]=7001 [rbd-nbd]=7002)
cephproxy_port=7010
# kill_recorded PIDFILE PROGRAM: stops the process a pid file names only if
# it still runs PROGRAM. A pid file that outlived its process (a machine
# restart, a killed run) may name an unrelated process by now.
kill_recorded() {
  local pidfile=$1 program pid exe
  program=$(readlink -f "$2")
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  # A binary rebuilt under a running process reads "PATH (deleted)"; one
  # run in the Ceph root (hack/ceph/run) reads the root's view of the
  # path: the name is compared.
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) && exe=${exe% (deleted)}
  if [[ $pid =~ ^[0-9]+$ ]] && [ "$(basename "$exe")" = "$(basename "$program")" ]; then
    kill "$pid" 2>/dev/null
  fi
  rm -f "$pidfile"
}
stop_controllers() {
  local dir
  for dir in "$WORK"/controller-*/; do
    [ -d "$dir" ] || continue
    kill_recorded "$dir/driver.pid" "$REPO/bin/spindle"
    kill_recorded "$dir/socat.pid" "$(command -v socat)"
  done
  return 0
}
start_controller() { # mounter
  local mounter=$1 dir=$WORK/controller-$1
  rm -rf "$dir" && mkdir -p "$dir"
  cat >"$dir/config.yaml" <<CONFIG
defaultBackend: rbd/ceph-test
backends:
  - type: rbd
    name: ceph-test
    rbd:
      clusterID: test
      monitors: ["$CEPH_MON"]
      pool: $CEPH_POOL
      userID: $CEPH_USER
      keyFile: $WORK/services/client.admin.key
      mounter: $mounter
      nodeRegistry: true
CONFIG
  ip netns exec "$VM_NETNS" "$REPO/bin/spindle" --mode controller --endpoint "unix://$dir/csi.sock" \
    --config "$dir/config.yaml" --log-format json >"$dir/driver.log" 2>&1 &
  echo $! >"$dir/driver.pid"
  for _ in $(seq 50); do [ -S "$dir/csi.sock" ] && break; sleep 0.2; done
  [ -S "$dir/csi.sock" ] || { echo "vmtest: the $mounter controller did not start:"; tail -5 "$dir/driver.log"; return 1; }
  ip netns exec "$VM_NETNS" socat "TCP-LISTEN:${controller_ports[$mounter]},bind=$VM_HOST_IP,fork,reuseaddr" \
    "UNIX-CONNECT:$dir/csi.sock" >"$dir/socat.log" 2>&1 &
  echo $! >"$dir/socat.pid"
}
guest_pid=
stop_cephproxy() {
  kill_recorded "$WORK/cephproxy.pid" "$SHARE/bin/cephproxy"
  return 0
}
cleanup() {
  if [ -n "$guest_pid" ]; then
    kill -TERM "$guest_pid" 2>/dev/null # run.sh stops its qemu
    wait "$guest_pid" 2>/dev/null
  fi
  stop_controllers
  stop_cephproxy
  "$VM/services.sh" down "$WORK/services" >/dev/null 2>&1
}
trap cleanup EXIT
# A killed run still stops its controllers and Ceph (exit runs the EXIT trap).
trap "exit 143" TERM
trap "exit 130" INT
t=$SECONDS
if [[ " $MODES " == *" krbd "* || " $MODES " == *" rbd-nbd "* ]]; then
  cleanup
  "$VM/services.sh" up "$WORK/services" || { echo "vmtest: Ceph for the guest did not start"; echo "0 passed, 1 failed"; exit 1; }
  mkdir -p "$SHARE/ceph" && cp "$WORK/services/ceph.conf" "$WORK/services/ceph.client.admin.keyring" "$WORK/services/services.env" "$SHARE/ceph/"
  # shellcheck disable=SC1091 # written by services.sh up
  . "$WORK/services/services.env"
  make --no-print-directory build >/dev/null || exit 1
  for mounter in krbd rbd-nbd; do
    [[ " $MODES " == *" $mounter "* ]] || continue
    start_controller "$mounter" || { echo "0 passed, 1 failed"; exit 1; }
  done
  # The guest's cluster-side rbd and ceph calls run here (hack/vm/cephproxy:
  # under emulation each costs seconds); VMTEST_CEPH_PROXY=0 keeps them all
  # in the guest.
  if [ "${VMTEST_CEPH_PROXY:-1}" = 1 ]; then
    # In the Ceph root the cluster runs from: this machine has no Ceph CLIs.
    ip netns exec "$VM_NETNS" "$REPO/hack/ceph/run" "$SHARE/bin/cephproxy" serve "$VM_HOST_IP:$cephproxy_port" >"$WORK/cephproxy.log" 2>&1 &
    echo $! >"$WORK/cephproxy.pid"
  fi
fi
phase services $((SECONDS - t))

# --- the guest's script: one line per run, "RUN <label> <package> <regexp> [VAR=value...]".
plan=$SHARE/plan
: >"$plan"
run() { [[ $1 =~ ${RUNS:-.} ]] && echo "RUN $*" >>"$plan"; return 0; }
# The data path under emulation: small and short, compared within the guest only.
datapath_env="SPINDLE_BENCH_FIO_SIZE=${VMTEST_FIO_SIZE:-256M} SPINDLE_BENCH_FIO_RUNTIME=5 SPINDLE_BENCH_FIO_RUNS=3"
iscsi_tests='^(TestConformance|TestAttachRefusals|TestACLAndCHAPFromTheInitiatorSide)$'
# The probe runs come first after the boot: they show the driver loading
# iscsi_tcp, rbd or nbd on a node that has not loaded it yet (a later run
# would find it loaded), once per module.
iscsi_probe=1
for mode in $MODES; do
  case $mode in
  kernel/tgt | kernel/lio)
    target=${mode#kernel/} env="SPINDLE_ISCSI_ATTACH=kernel SPINDLE_ISCSI_TARGET=${mode#kernel/}"
    tests=$iscsi_tests
    # tgtd forgets its targets when restarted and takes bsoflags; LIO does neither.
    [ "$target" = tgt ] && tests='^(TestConformance|TestAttachRefusals|TestACLAndCHAPFromTheInitiatorSide|TestReconcileAfterTgtdRestart|TestDirectIOReachesTgt)$'
    if [ "$iscsi_probe" = 1 ]; then
      run "iscsi-probe-$target" iscsi '^TestKernelProbeLoadsTheModuleOnARealKernel$' $env
      iscsi_probe=0
    fi
    run "iscsi-conformance-$target" iscsi "$tests" $env
    run "iscsi-sanity-mount-$target" sanity-iscsi '^TestSanityISCSI$' $env SPINDLE_SANITY_ACCESS=mount
    run "iscsi-sanity-block-$target" sanity-iscsi '^TestSanityISCSI$' $env SPINDLE_SANITY_ACCESS=block
    run "iscsi-sanity-stock-$target" sanity-iscsi '^TestStockSanityISCSI$' $env
    # With a node plugin (--mode=node) that has no pool, beside a controller.
    run "iscsi-lifecycle-$target" lifecycle '^(TestFullLifecycleISCSI|TestISCSINodeWithoutPool)$' $env
    # Encrypted volumes (dm-crypt, LUKS2) over the same path.
    run "luks-$target" lifecycle '^TestEncryptedISCSI$' $env
    [ "${DATAPATH:-}" = 1 ] && run "datapath-iscsi-$target" datapath-iscsi '^BenchmarkDataPathISCSI$' $env $datapath_env
    ;;
  krbd | rbd-nbd)
    env="SPINDLE_RBD_MOUNTER=$mode SPINDLE_CEPH_DIR=/mnt/share/ceph"
    [ "${VMTEST_CEPH_PROXY:-1}" = 1 ] && env="$env SPINDLE_CEPH_PROXY=$VM_HOST_IP:$cephproxy_port"
    controller="SPINDLE_SANITY_CONTROLLER=$VM_HOST_IP:${controller_ports[$mode]}"
    if [ "$mode" = krbd ]; then
      # Then whether the kernel decodes Tentacle's aes256k keys as the
      # driver's stage check holds.
      run "rbd-probe-$mode" rbd '^(TestProbeLoadsTheModuleOnARealKernel|TestKernelDecodesTheKeysItIsSaidTo)$' $env
    else
      run "rbd-probe-$mode" rbd '^TestProbeLoadsTheModuleOnARealKernel$' $env
    fi
    run "rbd-conformance-$mode" rbd '^TestConformance$' $env
    run "rbd-sanity-mount-$mode" sanity-rbd '^TestSanityRBD$' $env $controller SPINDLE_SANITY_ACCESS=mount
    run "rbd-sanity-block-$mode" sanity-rbd '^TestSanityRBD$' $env $controller SPINDLE_SANITY_ACCESS=block
    run "rbd-sanity-stock-$mode" sanity-rbd '^TestStockSanityRBD$' $env $controller SPINDLE_STOCK_SANITY_RBD=1
    run "rbd-lifecycle-$mode" rbd-e2e '^TestDatabaseMovesBetweenNodes$' $env
    run "luks-$mode" rbd-e2e '^TestEncryptedRBD$' $env
    [ "${DATAPATH:-}" = 1 ] && run "datapath-rbd-$mode" datapath-rbd '^BenchmarkDataPathRBD$' $env $datapath_env
    ;;
  loop)
    # The loop backend's lifecycle on a real kernel with every capability,
    # online ext4 growth included (it skips on this machine).
    run loop-lifecycle lifecycle '^(TestFullLifecycle|TestFormatOnce|TestExpand|TestSnapshotRestore|TestBlockReadOnlyPublish)$'
    run luks-loop lifecycle '^TestEncrypted$'
    # The loop data path with and without dm-crypt (this machine's kernel
    # has none, so its datapath loop/direct-io+luks lines come from here).
    [ "${DATAPATH:-}" = 1 ] && run datapath-loop datapath-loop '^BenchmarkDataPathLoop$' $datapath_env
    ;;
  *) echo "vmtest: unknown mode $mode"; exit 2 ;;
  esac
done
[ -s "$plan" ] || { echo "vmtest: no run matches MODES=\"$MODES\" RUNS=\"${RUNS:-}\""; echo "0 passed, 1 failed"; exit 2; }
cp "$VM/guest-run.sh" "$SHARE/run.sh"

t=$SECONDS
# The runs take long under emulation (run.sh's own default is 30 minutes).
# In the background with a wait: bash runs the TERM/INT traps only after a
# foreground pipeline ends, so a killed vmtest would wait hours for its
# guest (and leave Ceph and the controllers up until then).
TIMEOUT=${TIMEOUT:-14400} "$VM/run.sh" "$SHARE" > >(tee "$WORK/guest.log") 2>&1 &
guest_pid=$!
wait "$guest_pid"
guest_rc=$?
guest_pid=
phase "guest runs" $((SECONDS - t))

# --- the verdict, from the per-run results the guest wrote.
echo "vmtest: reports:"
cat "$SHARE"/out/reports/*.txt 2>/dev/null | sed 's/^/  /'
# CI keeps only this output, not the guest's logs: a failed run shows what
# its tests said last (--- FAIL and ginkgo's [FAIL] lines, t.Error/t.Fatal
# lines and their continuation; the passing tests' t.Log lines before them
# are cut), then the last RPCs its driver answered with an error
# (csi-sanity's expected refusals are many, so they come last and few).
why_failed() {
  [ -f "$1" ] || return 0
  awk '
    /^ *--- FAIL|\[FAIL\]/ { print; next }
    /_test\.go:[0-9]+:/ { print; more = 1; next }
    more && /^        / { print; next }
    { more = 0 }
  ' "$1" | tail -n 30 | sed 's/^/    /'
  awk '/"rpc"|\trpc\t/ && /"code": "/ && !/"code": "OK"/ { print substr($0, 1, 400) }' "$1" |
    tail -n 10 | sed 's/^/    /'
}
passed=0 failed=0
while read -r _ label _; do
  result=$SHARE/out/$label.result
  if [ -f "$result" ] && [ "$(cat "$result")" = pass ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "vmtest: FAILED $label ($(cat "$result" 2>/dev/null || echo "no result")); log: $SHARE/out/$label.log"
    why_failed "$SHARE/out/$label.log"
  fi
done <"$plan"
[ "$guest_rc" -eq 0 ] || [ "$failed" -gt 0 ] || { echo "vmtest: the guest exited $guest_rc"; failed=$((failed + 1)); }
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
