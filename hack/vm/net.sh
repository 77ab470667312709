#!/usr/bin/env bash
# The only network a guest has: a private network namespace ($VM_NETNS,
# default spindle-vm) holding a bridge vmbr0 with the host side's address
# 192.168.77.1/24 and persistent tap devices vmtap0..vmtap$((VM_TAPS - 1))
# on it. hack/vm/run.sh starts qemu inside the namespace on tap VM_ID and
# gives the guest 192.168.77.(2 + VM_ID)/24 (a static address on the kernel
# command line: no DHCP server to run or wait for).
#
#   hack/vm/net.sh up           create it (idempotent)
#   hack/vm/net.sh uplink       also link this machine to it (idempotent): a
#                               veth pair, 192.168.76.1 here and 192.168.76.2
#                               in the namespace, which forwards between the
#                               veth and the guests; this machine routes
#                               192.168.77.0/24 through it. For guests that
#                               are cluster nodes (hack/local-cluster/workers.sh)
#   hack/vm/net.sh uplink-down  remove that link again
#   hack/vm/net.sh down         delete it all; refuses while processes still
#                               run in it (qemu, Ceph, tgtd: stop them first,
#                               see services.sh)
#
# The namespace has no default route and no link to the host's own network
# but the uplink: a guest reaches what runs inside the namespace and, with
# the uplink, this machine, nothing beyond it. Services for the guests
# (hack/vm/services.sh) bind 192.168.77.1 inside it, so what they advertise
# is reachable from the guests and nothing collides with the host's
# 127.0.0.1. Unix sockets are files, not network, so host tools still reach
# e.g. tgtd's control socket from outside.
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
. "$(dirname "$0")/lib.sh"

case ${1:-} in
up)
  [ "$(id -u)" = 0 ] || die "needs root"
  netns_exists || ip netns add "$VM_NETNS"
  ip -n "$VM_NETNS" link set lo up
  ip -n "$VM_NETNS" link show "$VM_BRIDGE" >/dev/null 2>&1 ||
    ip -n "$VM_NETNS" link add "$VM_BRIDGE" type bridge
  ip -n "$VM_NETNS" addr replace "$VM_HOST_IP/$VM_PREFIX" dev "$VM_BRIDGE"
  ip -n "$VM_NETNS" link set "$VM_BRIDGE" up
  for ((i = 0; i < VM_TAPS; i++)); do
    tap=$(vm_tap "$i")
    ip -n "$VM_NETNS" link show "$tap" >/dev/null 2>&1 ||
      ip -n "$VM_NETNS" tuntap add dev "$tap" mode tap
    ip -n "$VM_NETNS" link set "$tap" master "$VM_BRIDGE" up
  done
  log "netns $VM_NETNS: $VM_BRIDGE $VM_HOST_IP/$VM_PREFIX, taps $(vm_tap 0)..$(vm_tap $((VM_TAPS - 1))) (guests $(vm_guest_ip 0)..)"
  ;;
uplink)
  [ "$(id -u)" = 0 ] || die "needs root"
  netns_exists || die "no netns $VM_NETNS: run $0 up first"
  if ! ip link show "$VM_UPLINK" >/dev/null 2>&1; then
    ip link add "$VM_UPLINK" type veth peer name "$VM_UPLINK_PEER" netns "$VM_NETNS"
  fi
  ip addr replace "$VM_UPLINK_HOST_IP/30" dev "$VM_UPLINK"
  ip link set "$VM_UPLINK" up
  ip -n "$VM_NETNS" addr replace "$VM_UPLINK_NS_IP/30" dev "$VM_UPLINK_PEER"
  ip -n "$VM_NETNS" link set "$VM_UPLINK_PEER" up
  in_netns sysctl -qw net.ipv4.ip_forward=1
  ip route replace "$VM_SUBNET" via "$VM_UPLINK_NS_IP"
  log "uplink $VM_UPLINK $VM_UPLINK_HOST_IP <-> $VM_UPLINK_NS_IP in $VM_NETNS; route $VM_SUBNET"
  ;;
uplink-down)
  ip link del "$VM_UPLINK" 2>/dev/null || true # (its routes go with it)
  ;;
down)
  netns_exists || exit 0
  pids=$(ip netns pids "$VM_NETNS" | tr '\n' ' ')
  if [ -n "${pids// /}" ]; then
    for p in $pids; do echo "  $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-120)" >&2; done
    die "processes still run in netns $VM_NETNS (stop them first: hack/vm/services.sh down DIR)"
  fi
  ip link del "$VM_UPLINK" 2>/dev/null || true
  ip netns del "$VM_NETNS"
  log "netns $VM_NETNS deleted"
  ;;
*)
  echo "usage: $0 up|uplink|uplink-down|down" >&2
  exit 2
  ;;
esac
