# Shared settings of the local cluster scripts; sourced, not run.
# shellcheck shell=bash disable=SC2034
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spindle/local-cluster}
# CLUSTER_DIR holds everything a running cluster has: state, sockets,
# logs, the kubelet root, the loop pool. `down` removes it all.
CLUSTER_DIR=${CLUSTER_DIR:-/var/tmp/spindle-local-cluster}
NODE=${NODE:-spindle-local-node}
DRIVER_NAME=${DRIVER_NAME:-spindle.csi.dev}
BIN=$CACHE/bin
DEBS=$CACHE/debs/root
RUN=$CLUSTER_DIR/run
LOGS=$CLUSTER_DIR/logs
KUBELET_DIR=$CLUSTER_DIR/kubelet
POOL_DIR=$CLUSTER_DIR/pool
CSI_SOCKET=$KUBELET_DIR/plugins/$DRIVER_NAME/csi.sock
CONTAINERD_SOCKET=$CLUSTER_DIR/containerd/containerd.sock
# The pods' network: a bridge on this machine and its subnet.
POD_BRIDGE=${POD_BRIDGE:-spindle-cni0}
POD_SUBNET=${POD_SUBNET:-10.244.0.0/24}
export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
export PATH="$DEBS/usr/bin:$DEBS/usr/sbin:$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
kubectl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
ctr() { "$DEBS/usr/bin/ctr" -a "$CONTAINERD_SOCKET" "$@"; }
# Components in start order; down stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet spindle
  csi-provisioner csi-attacher csi-resizer csi-snapshotter snapshot-controller)
# count_results FILE: passed and failed of a `go test -v` run.
# shellcheck source=hack/test-results.sh
. "$REPO/hack/test-results.sh"
