#!/usr/bin/env bash
# The only network a guest has: a private network namespace ($VM_NETNS,
# default spindle-vm) holding a persistent tap device vmtap0 with the host
# side's address 192.168.77.1/24. hack/vm/run.sh starts qemu inside the
# namespace on that tap and gives the guest 192.168.77.2/24 (a static address
# on the kernel command line: no DHCP server to run or wait for).
#
#   hack/vm/net.sh up      create it (idempotent)
#   hack/vm/net.sh down    delete it; refuses while processes still run in it
#                          (qemu, Ceph, tgtd: stop them first, see services.sh)
#
# The namespace has no route anywhere else and no link to the host's own
# network: a guest reaches only what runs inside the namespace. Services for
# the guest (hack/vm/services.sh) bind 192.168.77.1 inside it, so what they
# advertise is reachable from the guest and nothing collides with the
# host's 127.0.0.1. Unix sockets are files, not network, so host tools still
# reach e.g. tgtd's control socket from outside.
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
. "$(dirname "$0")/lib.sh"

case ${1:-} in
up)
  [ "$(id -u)" = 0 ] || die "needs root"
  netns_exists || ip netns add "$VM_NETNS"
  ip -n "$VM_NETNS" link set lo up
  ip -n "$VM_NETNS" link show "$VM_TAP" >/dev/null 2>&1 ||
    ip -n "$VM_NETNS" tuntap add dev "$VM_TAP" mode tap
  ip -n "$VM_NETNS" addr replace "$VM_HOST_IP/$VM_PREFIX" dev "$VM_TAP"
  ip -n "$VM_NETNS" link set "$VM_TAP" up
  log "netns $VM_NETNS: $VM_TAP $VM_HOST_IP/$VM_PREFIX (guest $VM_GUEST_IP)"
  ;;
down)
  netns_exists || exit 0
  pids=$(ip netns pids "$VM_NETNS" | tr '\n' ' ')
  if [ -n "${pids// /}" ]; then
    for p in $pids; do echo "  $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-120)" >&2; done
    die "processes still run in netns $VM_NETNS (stop them first: hack/vm/services.sh down DIR)"
  fi
  ip netns del "$VM_NETNS"
  log "netns $VM_NETNS deleted"
  ;;
*)
  echo "usage: $0 up|down" >&2
  exit 2
  ;;
esac
