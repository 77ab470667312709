#!/usr/bin/env bash
# Boots one guest (hack/vm/build.sh's) and runs SHAREDIR/run.sh in it as root.
#
#   hack/vm/run.sh SHAREDIR
#
# The guest sees SHAREDIR at /mnt/share (9p, read-write, as root) and runs
# ./run.sh there (cwd /mnt/share, stdin /dev/null, LC_ALL=C); its output goes
# to the serial console, which this script streams to stdout, and to
# SHAREDIR/out/run.log. When run.sh ends the guest powers off and this script
# exits with run.sh's exit status. The channel's own files are in
# SHAREDIR/out/ (created if needed; these four are removed before the boot,
# anything else there is left alone):
#   run.log       run.sh's output (stdout and stderr)
#   rc            run.sh's exit status
#   console.log   the whole serial console, with host timestamps
#   vm.env        VM_ACCEL VM_BOOT_SECONDS VM_TOTAL_SECONDS VM_PEAK_RSS_KB VM_RC
# If the guest never reports a status (timeout, kernel panic, qemu failure)
# it says so on stderr and exits 125.
#
# Env:
#   TIMEOUT=1800   seconds for the whole run, boot included (then qemu is killed)
#   MEM=2048 SMP=2 guest memory (MiB) and CPUs
#   ACCEL=auto     auto|tcg|kvm. auto: KVM only with kvm_intel/kvm_amd loaded and
#                  no kvm_pvm. This machine's /dev/kvm is kvm_pvm, which cannot
#                  run a stock kernel (it dies on cmpxchg16b/xrstor emulation),
#                  so it gets TCG, multi-threaded.
#   VM_NET=auto    auto|tap|none. tap: qemu runs in hack/vm/net.sh's netns on
#                  tap vmtap$VM_ID and the guest is 192.168.77.(2 + VM_ID)/24 on
#                  eth0 (host side 192.168.77.1); auto: tap when that netns
#                  exists, else none
#   VM_ID=0        which guest this is (0 .. VM_TAPS-1): its tap, address and
#                  MAC. Guests with different VM_IDs run at once
#   VM_DISK=FILE   a raw disk image the guest sees as /dev/vdb (kept: for
#                  state that outlives a boot, e.g. a worker node's)
#   VM_EXTRA_SHARES="TAG=DIR ..."  more host directories over 9p, each under
#                  its mount tag (the guest mounts them itself), e.g. a pool
#                  that several guests share
#   VM_IO_REALTIME=1  qemu's threads but its vCPUs (the main loop, which
#                  serves 9p, the NIC and the disks' completions, and its I/O
#                  worker threads) run SCHED_RR: under TCG the vCPU threads
#                  take every CPU they get, and on a loaded 2-core host those
#                  threads waited on the run queue 3-4 times as long as they
#                  ran, and a loop volume's 9p writes stalled for seconds
#                  (docs/results/2026-11-29-testing-history.md, run R).
#                  0: qemu's threads keep the default policy
#   VM_VERBOSE=1   full boot messages on the console (default: quiet boot)
#   VM_APPEND=...  more kernel command line
#   INTERACTIVE=1  no run.sh: a root shell on the serial console (SHAREDIR is
#                  optional; mount it with: mount -t 9p -o trans=virtio spindle /mnt)
#                  quit with Ctrl-a x
# The image's iSCSI initiator name is the same in every guest: guests that
# log in at once must set their own (hack/local-cluster/worker-guest.sh does).
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
. "$(dirname "$0")/lib.sh"

TIMEOUT=${TIMEOUT:-1800}
MEM=${MEM:-2048}
SMP=${SMP:-2}
INTERACTIVE=${INTERACTIVE:-0}
if [ "$INTERACTIVE" = 1 ]; then SHARE=${1:-}; else SHARE=${1:?usage: $0 SHAREDIR}; fi

[ "$(id -u)" = 0 ] || die "needs root"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing; run hack/install-deps.sh"
for f in vmlinux initramfs.img rootfs.img; do
  [ -s "$GUEST_DIR/$f" ] || die "no guest in $GUEST_DIR; run hack/vm/build.sh first"
done
if [ -n "$SHARE" ]; then
  [ -d "$SHARE" ] || die "$SHARE is not a directory"
  SHARE=$(realpath "$SHARE")
  [ "$INTERACTIVE" = 1 ] || [ -x "$SHARE/run.sh" ] || die "$SHARE/run.sh is missing or not executable"
fi

# --- accelerator -------------------------------------------------------------
ACCEL=${ACCEL:-auto}
if [ "$ACCEL" = auto ]; then
  ACCEL=tcg
  if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; } && [ ! -d /sys/module/kvm_pvm ]; then
    ACCEL=kvm
  fi
fi
# shellcheck disable=SC2054 # qemu's option values have commas
case $ACCEL in
kvm) ACCEL_ARGS=(-machine pc,accel=kvm -cpu host) ;;
# -la57: with 5-level paging under TCG, userspace breaks (glibc's
# _dl_get_origin assertion in every static exec). -svm: else the guest's udev
# loads kvm_amd for nothing. tb-size: TCG's translation cache (MiB), most
# of qemu's memory beyond the guest's.
tcg) ACCEL_ARGS=(-machine pc -accel "tcg,thread=multi,tb-size=${TB_SIZE:-256}" -cpu max,-svm,-la57) ;;
*) die "ACCEL must be auto, tcg or kvm" ;;
esac

# --- network -----------------------------------------------------------------
VM_NET=${VM_NET:-auto}
VM_ID=${VM_ID:-0}
if ! [[ $VM_ID =~ ^[0-9]+$ ]] || [ "$VM_ID" -ge "$VM_TAPS" ]; then die "VM_ID must be 0..$((VM_TAPS - 1))"; fi
TAP=$(vm_tap "$VM_ID")
if [ "$VM_NET" = auto ]; then
  if netns_exists; then VM_NET=tap; else VM_NET=none; fi
fi
NS=()
NET_ARGS=()
APPEND="console=ttyS0,115200 root=/dev/vda rw panic=-1 net.ifnames=0"
case $VM_NET in
tap)
  if ! netns_exists || ! in_netns ip link show "$TAP" >/dev/null 2>&1; then
    die "VM_NET=tap but there is no netns $VM_NETNS with $TAP: run hack/vm/net.sh up"
  fi
  NS=(ip netns exec "$VM_NETNS")
  # shellcheck disable=SC2054 # qemu's option values have commas
  NET_ARGS=(-netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no"
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:$(printf %02x "$VM_ID")")
  APPEND="$APPEND spindle.ip=$(vm_guest_ip "$VM_ID")/$VM_PREFIX"
  ;;
none) ;;
*) die "VM_NET must be auto, tap or none" ;;
esac
[ "${VM_VERBOSE:-0}" = 1 ] || APPEND="$APPEND quiet loglevel=4"
# Without a login prompt on the console while run.sh's output streams there.
[ "$INTERACTIVE" = 1 ] || APPEND="$APPEND spindle.run systemd.mask=serial-getty@ttyS0.service"
APPEND="$APPEND ${VM_APPEND:-}"

# --- the run's own files: overlay, pid file; removed on every exit -----------
mkdir -p "$VM_CACHE/run"
RUN=$(mktemp -d "$VM_CACHE/run/vm.XXXXXX")
SAMPLER=
# shellcheck disable=SC2317 # (run by the trap)
cleanup() {
  local p
  [ -z "$SAMPLER" ] || kill "$SAMPLER" 2>/dev/null || true
  p=$(cat "$RUN/qemu.pid" 2>/dev/null || true)
  if [ -n "$p" ] && alive "$p" && grep -q '^qemu-system' "/proc/$p/comm" 2>/dev/null; then
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$p" || break; sleep 0.1; done
    ! alive "$p" || kill -KILL "$p" 2>/dev/null || true
  fi
  rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Every run starts from the built image: writes go to a throw-away overlay.
qemu-img create -q -f qcow2 -F raw -b "$GUEST_DIR/rootfs.img" "$RUN/overlay.qcow2"
DISK_ARGS=()
if [ -n "${VM_DISK:-}" ]; then
  [ -f "$VM_DISK" ] || die "VM_DISK=$VM_DISK is not a file"
  DISK_ARGS=(-drive "file=$VM_DISK,if=virtio,format=raw,cache=writeback,discard=unmap")
fi
for spec in ${VM_EXTRA_SHARES:-}; do
  tag=${spec%%=*} dir=${spec#*=}
  if [ ! -d "$dir" ] || [ -z "$tag" ]; then die "VM_EXTRA_SHARES: $spec is not TAG=DIRECTORY"; fi
  DISK_ARGS+=(-virtfs "local,path=$(realpath "$dir"),mount_tag=$tag,security_model=none,multidevs=remap,id=$tag")
done
SHARE_ARGS=()
if [ -n "$SHARE" ]; then
  # multidevs=remap: inode numbers stay unique if SHAREDIR spans filesystems.
  SHARE_ARGS=(-virtfs "local,path=$SHARE,mount_tag=spindle,security_model=none,multidevs=remap,id=share")
fi
# debug-threads: the vCPU threads are named "CPU N/TCG" (or /KVM), so
# io_threads_first can tell them from the rest.
QEMU=("${NS[@]}" qemu-system-x86_64 "${ACCEL_ARGS[@]}" -m "$MEM" -smp "$SMP" -name "spindle-vm$VM_ID,debug-threads=on"
  -nodefaults -no-user-config -no-reboot -display none
  -kernel "$GUEST_DIR/vmlinux" -initrd "$GUEST_DIR/initramfs.img" -append "$APPEND"
  -drive "file=$RUN/overlay.qcow2,if=virtio,format=qcow2,cache=unsafe,discard=unmap"
  "${DISK_ARGS[@]}" -device virtio-rng-pci "${SHARE_ARGS[@]}" "${NET_ARGS[@]}" -pidfile "$RUN/qemu.pid")

if [ "$INTERACTIVE" = 1 ]; then
  # (-nographic would add no serial port together with -nodefaults)
  "${QEMU[@]}" -serial mon:stdio
  exit $?
fi

# io_threads_first PID: qemu's threads other than its vCPUs get SCHED_RR
# (VM_IO_REALTIME). They wake for each 9p request, each packet and each
# disk completion, and run briefly (a worker's main loop: 3-5 % of a CPU
# in run R); the guest's I/O waits for them, not for its vCPUs. The threads
# qemu starts later (its I/O worker pool grows on demand) inherit the
# policy from the main loop that starts them; the vCPU threads, started
# before this, keep the default one.
io_threads_first() {
  local p=$1 t vcpus=0 until=$((SECONDS + 60))
  [ "${VM_IO_REALTIME:-1}" = 1 ] || return 0
  # The vCPU threads exist once the machine is built, before the guest runs.
  while [ "$vcpus" -lt "$SMP" ]; do
    if [ "$SECONDS" -ge "$until" ] || ! alive "$p"; then
      echo "run.sh: qemu's vCPU threads not found; its threads keep the default scheduling" >&2
      return 0
    fi
    sleep 0.1
    vcpus=$(cat "/proc/$p/task/"*/comm 2>/dev/null | grep -c '^CPU [0-9]*/' || true)
  done
  # The main loop first: threads it starts meanwhile inherit the policy.
  for t in "/proc/$p/task/$p" "/proc/$p/task/"*; do
    case $(cat "$t/comm" 2>/dev/null) in "CPU "*) continue ;; esac
    # (a worker thread may have ended since the listing)
    if ! chrt -r -p 1 "${t##*/}" >/dev/null 2>&1 && alive "${t##*/}"; then
      echo "run.sh: chrt -r -p 1 ${t##*/} (a qemu I/O thread) failed; it keeps the default scheduling" >&2
    fi
  done
}

OUT=$SHARE/out
mkdir -p "$OUT"
rm -f "$OUT/run.log" "$OUT/rc" "$OUT/rc.tmp" "$OUT/console.log" "$OUT/vm.env"

# qemu's peak RSS: VmHWM only grows, so its last sample is the peak.
(
  while [ ! -s "$RUN/qemu.pid" ]; do sleep 0.05; done
  p=$(cat "$RUN/qemu.pid")
  io_threads_first "$p"
  while hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$p/status" 2>/dev/null) && [ -n "$hwm" ]; do
    echo "$hwm" >"$RUN/hwm.tmp" && mv "$RUN/hwm.tmp" "$RUN/hwm"
    sleep 0.2
  done
) &
SAMPLER=$!

echo "run.sh: booting the guest (accel $ACCEL, $SMP CPUs, $MEM MiB, net $VM_NET, timeout $TIMEOUT s)"
T0=$(now_us)
# The console: to stdout as it is, and to console.log with the time since
# qemu started. The guest's first command prints SPINDLE-VM-START. In the
# background with a wait, so that INT/TERM reach the cleanup trap at once
# (bash runs traps only after a foreground pipeline ends).
{
  rc=0
  timeout -k 10 "$TIMEOUT" "${QEMU[@]}" -monitor none -serial stdio </dev/null 2>&1 || rc=$?
  echo "$rc" >"$RUN/qemu.rc" 2>/dev/null || true # ($RUN is gone after INT/TERM)
} | while IFS= read -r line; do
  line=${line%$'\r'}
  d=$((${EPOCHREALTIME/./} - T0)) # (no $(now_us): a fork per line)
  if [ ! -e "$RUN/boot_us" ] && [[ $line == SPINDLE-VM-START* ]]; then echo "$d" >"$RUN/boot_us"; fi
  printf '%s\n' "$line"
  printf '[%4d.%03d] %s\n' $((d / 1000000)) $(((d / 1000) % 1000)) "$line" >>"$OUT/console.log"
done &
wait $! || true
QRC=$(cat "$RUN/qemu.rc" 2>/dev/null || echo none)
TOTAL_US=$(($(now_us) - T0))
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
SAMPLER=

secs() { printf '%d.%d' $(($1 / 1000000)) $((($1 / 100000) % 10)); }
BOOT=$( [ -s "$RUN/boot_us" ] && secs "$(cat "$RUN/boot_us")" || echo none)
HWM=$(cat "$RUN/hwm" 2>/dev/null || echo 0)
RC=$(cat "$OUT/rc" 2>/dev/null || true)
[[ $RC =~ ^[0-9]+$ ]] || RC=
cat >"$OUT/vm.env" <<EOF
VM_ACCEL=$ACCEL
VM_BOOT_SECONDS=$BOOT
VM_TOTAL_SECONDS=$(secs "$TOTAL_US")
VM_PEAK_RSS_KB=$HWM
VM_RC=${RC:-none}
EOF
echo "run.sh: accel $ACCEL; boot (qemu start -> first guest command) $BOOT s; total $(secs "$TOTAL_US") s;" \
  "qemu peak RSS $((HWM / 1024)) MiB; guest run.sh exit status ${RC:-none}"
if [ -z "$RC" ]; then
  if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    why="timed out after $TIMEOUT s (TIMEOUT)"
  elif [ "$BOOT" = none ]; then
    why="qemu exited with status $QRC before the guest ran anything (boot failure? see $OUT/console.log)"
  else
    why="qemu exited with status $QRC while run.sh was running (guest crash? see $OUT/console.log)"
  fi
  echo "run.sh: the guest never reported run.sh's exit status: $why" >&2
  exit 125
fi
exit "$RC"
