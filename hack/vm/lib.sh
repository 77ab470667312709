# shellcheck shell=bash disable=SC2034 # the settings are for the scripts that source this
# Settings and helpers shared by hack/vm/*.sh; sourced, never run.
#
# The guests' network is a private network namespace ($VM_NETNS) holding a
# bridge with the host side's address $VM_HOST_IP and one tap per guest:
# guest N (run.sh's VM_ID, default 0) is on tap vmtapN with address
# 192.168.77.(2 + N); $VM_GUEST_IP is guest 0's. Services for the guests
# (Ceph, tgtd) run inside the namespace; nothing outside it is reachable
# from a guest but, with net.sh's uplink, this machine.
export LC_ALL=C
export PATH="$PATH:/usr/sbin:/sbin"

VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$VM_DIR/../.." && pwd)
VM_CACHE=${VM_CACHE:-${HOME:-/root}/.cache/spindle/vm}
GUEST_DIR=$VM_CACHE/guest          # the built guest (hack/vm/build.sh)

VM_NETNS=${VM_NETNS:-spindle-vm}
VM_BRIDGE=vmbr0                    # these live inside $VM_NETNS only
VM_TAPS=${VM_TAPS:-4}              # guests that can run at once
VM_HOST_IP=192.168.77.1
VM_GUEST_IP=192.168.77.2
VM_PREFIX=24
VM_SUBNET=192.168.77.0/24
# net.sh uplink: a veth pair between this machine and the namespace.
VM_UPLINK=spindle-vm0
VM_UPLINK_PEER=uplink0
VM_UPLINK_HOST_IP=192.168.76.1
VM_UPLINK_NS_IP=192.168.76.2

# vm_tap N, vm_guest_ip N: guest N's tap device and address.
vm_tap() { echo "vmtap$1"; }
vm_guest_ip() { echo "192.168.77.$((2 + $1))"; }

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
