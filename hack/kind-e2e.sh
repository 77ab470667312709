#!/usr/bin/env bash
# Spindle end to end in kind, for machines with Docker: a cluster from
# hack/kind/config.yaml (control plane + 2 workers, the host's /dev and a
# shared loop pool in every node), the driver image built with the
# Dockerfile and loaded into the nodes, the snapshot CRDs, `helm install`
# of charts/spindle (sidecars from registry.k8s.io), then the Kubernetes e2e
# tests (e2e/kubernetes). The cluster is deleted at the end unless KEEP=1.
#
# What the e2e tests need, and what kind gives them: they find the cluster
# through SPINDLE_E2E_CLUSTER_DIR/admin.kubeconfig (written here) and
# SPINDLE_E2E_NODE. Written for hack/local-cluster, some of them also look
# at the node from the host (kubelet's mounts, the pool's image files, the
# CSI socket, the driver's log file under CLUSTER_DIR/logs); in kind those
# live inside the node containers, so those checks need a kind mode in the
# tests (docker exec into the node, kubectl logs) before they pass here.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
NAME=${KIND_CLUSTER:-spindle}
WORK=/tmp/spindle-kind # the pool path is fixed in hack/kind/config.yaml
SNAPSHOTTER=${SNAPSHOTTER:-v8.7.0}
export PATH="$PATH:/usr/local/go/bin"
for b in docker kind kubectl go; do
  command -v "$b" >/dev/null || { echo "kind-e2e: $b is not installed" >&2; exit 1; }
done
HELM=$(command -v helm || "$REPO/hack/helm.sh")
export KUBECONFIG=$WORK/admin.kubeconfig
mkdir -p "$WORK/pool" "$WORK/images"
cd "$REPO"

kind create cluster --name "$NAME" --config hack/kind/config.yaml --kubeconfig "$KUBECONFIG" --wait 120s
if [ "${KEEP:-0}" != 1 ]; then
  trap 'kind delete cluster --name "$NAME"' EXIT
fi

# Images: the driver from the Dockerfile; the e2e pods' image from its
# static binary (hack/imagetar, as the local cluster does).
docker build -t local.test/spindle:dev --build-arg VERSION="$(git describe --tags --always --dirty 2>/dev/null || echo dev)" .
kind load docker-image --name "$NAME" local.test/spindle:dev
CGO_ENABLED=0 go build -trimpath -o "$WORK/images/spindle-e2e-pod" ./e2e/cmd/spindle-e2e-pod
go run ./hack/imagetar -tag local.test/spindle-e2e-pod:1 -o "$WORK/images/e2e-pod.tar" \
  -file "$WORK/images/spindle-e2e-pod:/usr/local/bin/spindle-e2e-pod" -entrypoint /usr/local/bin/spindle-e2e-pod
kind load image-archive --name "$NAME" "$WORK/images/e2e-pod.tar"

# The VolumeSnapshot CRDs ship in the snapshotter's client module.
go mod download "github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER"
crds="$(go env GOMODCACHE)/github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER/config/crd"
for f in "$crds"/*.yaml; do
  case $f in */kustomization.yaml) ;; *) kubectl apply -f "$f" ;; esac
done

"$HELM" install spindle charts/spindle --namespace kube-system --wait --timeout 5m \
  --set driver.image.repository=local.test/spindle --set driver.image.tag=dev \
  --set snapshotController.enabled=true \
  --set 'storageClasses[0].name=spindle-ext4' --set 'storageClasses[0].parameters.csi\.storage\.k8s\.io/fstype=ext4' \
  --set 'storageClasses[1].name=spindle-xfs' --set 'storageClasses[1].parameters.csi\.storage\.k8s\.io/fstype=xfs'

SPINDLE_E2E_CLUSTER_DIR=$WORK SPINDLE_E2E_NODE=$NAME-worker \
  go test -count=1 -v -timeout 30m ./e2e/kubernetes/
