# shellcheck shell=bash disable=SC2034 # the settings are for the scripts that source this
# Settings and helpers shared by hack/vm/*.sh; sourced, never run.
#
# One guest runs at a time. Its network is a private network namespace
# ($VM_NETNS) holding a tap device: the host side of the tap is $VM_HOST_IP,
# the guest is $VM_GUEST_IP. Nothing outside that namespace is reachable from
# the guest, and services for the guest (Ceph, tgtd) run inside it.
export LC_ALL=C
export PATH="$PATH:/usr/sbin:/sbin"

VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$VM_DIR/../.." && pwd)
VM_CACHE=${VM_CACHE:-${HOME:-/root}/.cache/spindle/vm}
GUEST_DIR=$VM_CACHE/guest          # the built guest (hack/vm/build.sh)

VM_NETNS=${VM_NETNS:-spindle-vm}
VM_TAP=vmtap0                      # lives inside $VM_NETNS only
VM_HOST_IP=192.168.77.1
VM_GUEST_IP=192.168.77.2
VM_PREFIX=24

die() { echo "$(basename "$0"): $*" >&2; exit 1; }
log() { echo "$(basename "$0"): $*"; }

# now_us: wall clock in microseconds; since US: elapsed seconds, 1 decimal.
now_us() { echo "${EPOCHREALTIME/./}"; }
since() { local d=$(( $(now_us) - $1 )); printf '%d.%d' $((d / 1000000)) $(((d / 100000) % 10)); }

netns_exists() { [ -e "/run/netns/$VM_NETNS" ]; }
# in_netns CMD...: run CMD inside the guests' network namespace.
in_netns() { ip netns exec "$VM_NETNS" "$@"; }

# alive PID: the process exists and is not a zombie.
alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
