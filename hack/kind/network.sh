#!/usr/bin/env bash
# hack/kind/network.sh: the pod network of a kind cluster created without
# kind's own (networking.disableDefaultCNI, hack/kind/config.yaml), doing
# what kind's kindnetd does for a single-stack cluster whose nodes share one
# Docker network:
#   - each node's pods get addresses from the node's podCIDR (assigned by
#     kube-controller-manager) through the standard ptp and host-local CNI
#     plugins, which every kind node image has in /opt/cni/bin;
#   - each node routes every other node's podCIDR to that node's address;
#   - traffic from the pods to anywhere outside the pods' range leaves
#     masqueraded as the node (an nftables table of the node's own network
#     namespace; nothing on the host changes).
# Then it waits until every node is Ready. kindnetd itself cannot be built
# here (its module is not on the Go module proxy at a usable version), and
# a fixed three-node test cluster needs no daemon that follows nodes coming
# and going. Run it again after adding a node.
#
# Env: KUBECONFIG (the cluster's), KUBECTL (kubectl), WAIT (300s).
set -euo pipefail
KUBECTL=${KUBECTL:-kubectl}
k() { "$KUBECTL" "$@"; }
log() { echo "network: $*" >&2; }

subnet=$(k -n kube-system get configmap kubeadm-config -o jsonpath='{.data.ClusterConfiguration}' | sed -n 's/^ *podSubnet: *//p')
[ -n "$subnet" ] || { log "no podSubnet in kubeadm's ClusterConfiguration"; exit 1; }

# NAME PODCIDR ADDRESS per node, once every node has a podCIDR.
all_assigned() { [ -n "$1" ] && awk 'NF < 3 {exit 1}' <<<"$1"; }
for _ in $(seq 120); do
  nodes=$(k get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}')
  all_assigned "$nodes" && break
  sleep 1
done
all_assigned "$nodes" || { log "nodes without a podCIDR or an address: $nodes"; exit 1; }

while read -r node cidr addr; do
  mtu=$(docker exec "$node" cat /sys/class/net/eth0/mtu)
  docker exec -i "$node" sh -c 'cat >/etc/cni/net.d/10-spindle-ptp.conflist' <<EOF
{
  "cniVersion": "0.4.0",
  "name": "spindle-pods",
  "plugins": [
    {
      "type": "ptp",
      "mtu": $mtu,
      "ipMasq": false,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    }
  ]
}
EOF
  while read -r other other_cidr other_addr; do
    [ "$other" = "$node" ] || docker exec "$node" ip route replace "$other_cidr" via "$other_addr"
  done <<<"$nodes"
  # Declared, deleted and made again: the same result however often it runs.
  docker exec -i "$node" nft -f - <<EOF
table ip spindle-pods
delete table ip spindle-pods
table ip spindle-pods {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr $subnet ip daddr != $subnet masquerade
  }
}
EOF
  log "$node ($addr): pods in $cidr"
done <<<"$nodes"

k wait --for=condition=Ready node --all --timeout="${WAIT:-300s}" >/dev/null
log "every node Ready"
