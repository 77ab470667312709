#!/usr/bin/env bash
# Builds what the local cluster runs: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kubectl, the CSI sidecars
# (csi-provisioner, csi-attacher, csi-resizer, csi-snapshotter,
# snapshot-controller) and containerd + runc + the CNI loopback plugin from
# Debian's packages (unpacked, not installed, so no service starts). With
# KIND_NODE=1 also kubeadm and kube-proxy, which hack/kind's offline node
# image needs besides the five Kubernetes binaries above.
#
# Everything is cached in $CACHE (default ~/.cache/spindle/local-cluster):
# a component is rebuilt only when its pinned version changes (the cold and
# warm build times are in docs/testing.md).
#
# The pins are versions the Go module proxy here serves. k8s.io/kubernetes
# cannot be `go install`ed (its go.mod replaces the staging modules with
# ./staging paths), so it is built from a scratch module that replaces each
# staging module by its published v0.N.x; the sidecars likewise copy their
# own replace directives.
set -euo pipefail

K8S=${K8S:-v1.36.3}
ETCD=${ETCD:-v3.6.8}
GINKGO=${GINKGO:-v2.28.1} # the version k8s.io/kubernetes $K8S requires
PROVISIONER=${PROVISIONER:-v6.3.0}
ATTACHER=${ATTACHER:-v4.13.0}
RESIZER=${RESIZER:-v2.3.0}
SNAPSHOTTER=${SNAPSHOTTER:-v8.7.0}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spindle/local-cluster}
REPO=$(cd "$(dirname "$0")/../.." && pwd)

export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
GOMODCACHE=$(go env GOMODCACHE)
export GOMODCACHE GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath
BIN=$CACHE/bin SRC=$CACHE/src STAMPS=$CACHE/stamps
mkdir -p "$BIN" "$SRC" "$STAMPS" "$CACHE/debs"

# step NAME VERSION FUNC...: runs FUNC unless NAME was built at VERSION.
step() {
  local name=$1 version=$2 start=$SECONDS
  shift 2
  if [ -f "$STAMPS/$name-$version" ]; then return 0; fi
  rm -f "$STAMPS/$name"-*
  echo "build: $name $version" >&2
  "$@"
  touch "$STAMPS/$name-$version"
  echo "build: $name $version took $((SECONDS - start))s" >&2
}

# containerd 1.6, runc, the CNI plugins and busybox-static (for the images
# the Kubernetes e2e suite runs), unpacked under $CACHE/debs/root.
debs() {
  local d=$CACHE/debs
  rm -rf "$d" && mkdir -p "$d/root"
  local pkgs=(containerd runc containernetworking-plugins busybox-static)
  # A fresh machine may have no package lists yet. (apt-get warns that
  # root downloads unsandboxed; the packages still arrive.)
  (cd "$d" && apt-get download -q "${pkgs[@]}" >/dev/null 2>&1) ||
    (apt-get update -qq && cd "$d" && apt-get download -q "${pkgs[@]}" 2>&1 | grep -v unsandboxed)
  local deb
  for deb in "$d"/*.deb; do dpkg -x "$deb" "$d/root"; done
  test -x "$d/root/usr/bin/containerd" && test -x "$d/root/usr/sbin/runc" && test -x "$d/root/bin/busybox"
}

# scratch_module DIR MODULE VERSION [copy-replaces] PKG...: a module that
# requires MODULE@VERSION, with MODULE's own replace directives (relative
# ones pointing at MODULE's sub-modules of the same version).
scratch_module() {
  local dir=$1 module=$2 version=$3 copy=$4
  shift 4
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  go mod download "$module@$version"
  local upstream=$GOMODCACHE/cache/download/$module/@v/$version.mod
  {
    echo "module example.local/scratch"
    echo "go $(awk '/^go /{print $2; exit}' "$upstream")"
    echo "require $module $version"
    if [ "$copy" = copy-replaces ]; then
      awk -v V="$version" '
        function emit(line,   parts, lhs, rhs) {
          split(line, parts, "=>"); split(parts[1], lhs, " "); rhs = parts[2]
          gsub(/^[ \t]+|[ \t]+$/, "", rhs)
          if (rhs ~ /^\.\.?\//) print "replace " lhs[1] " => " lhs[1] " " V
          else print "replace " lhs[1] " => " rhs
        }
        /^replace \(/ { block = 1; next }
        block && /^\)/ { block = 0; next }
        /^replace / { sub(/^replace /, ""); emit($0); next }
        block && /=>/ { emit($0) }' "$upstream"
    fi
  } > go.mod
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    local p
    for p in "$@"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n'
  } > tools.go
  go mod tidy
}

etcd() {
  scratch_module "$SRC/etcd" go.etcd.io/etcd/server/v3 "$ETCD" no-replaces go.etcd.io/etcd/server/v3
  go build -ldflags '-s -w' -o "$BIN/etcd" go.etcd.io/etcd/server/v3
}

# kubernetes_module DIR: DIR (emptied) becomes a module that requires
# k8s.io/kubernetes@$K8S with each of its staging modules replaced by the
# published v0.N.x of the same release; the caller is left in DIR.
kubernetes_module() {
  local dir=$1 staging=v0.${K8S#v1.}
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  go mod download "k8s.io/kubernetes@$K8S"
  local upstream=$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/$K8S.mod
  {
    echo "module example.local/$(basename "$dir")"
    echo "go $(awk '/^go /{print $2; exit}' "$upstream")"
    grep '^godebug default' "$upstream" || true
    echo "require k8s.io/kubernetes $K8S"
    grep -E '=> \./staging' "$upstream" | awk -v V="$staging" '{print "replace " $1 " => " $1 " " V}'
  } > go.mod
}

# The version stamped into Kubernetes' binaries (what `kubectl version`
# and the e2e suite report).
kubernetes_version_x() {
  local minor
  minor=$(echo "$K8S" | cut -d. -f2)
  echo "-X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1" \
    "-X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
}

# kubernetes_cmds NAME CMD...: k8s.io/kubernetes/cmd/CMD... built in the
# scratch module $SRC/NAME.
kubernetes_cmds() {
  local name=$1
  shift
  kubernetes_module "$SRC/$name"
  local cmds=("$@")
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    local c
    for c in "${cmds[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    printf ')\n'
  } > tools.go
  go mod tidy
  local x
  x="$(kubernetes_version_x) -X k8s.io/client-go/pkg/version.gitVersion=$K8S"
  go build -ldflags "-s -w $x" -o "$BIN/" "${cmds[@]/#/k8s.io/kubernetes/cmd/}"
}

kubernetes() { kubernetes_cmds kubernetes kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; }

# What a kind node adds to the local cluster's five (hack/kind builds its
# node image from this cache): kubeadm, which kind runs in every node, and
# kube-proxy, which kubeadm deploys.
kubernetes_node() { kubernetes_cmds kubernetes-node kubeadm kube-proxy; }

# The Kubernetes e2e suite (e2e.test, for `make e2e-storage`) and agnhost,
# the test image's binary, from the same release; a scratch module of its
# own with the same staging replaces as kubernetes() above.
kubernetes_e2e() {
  kubernetes_module "$SRC/kubernetes-e2e"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/test/e2e"\n\t_ "k8s.io/kubernetes/test/images/agnhost"\n)\n' > tools.go
  go mod tidy
  go test -c -ldflags "-s -w $(kubernetes_version_x)" -o "$BIN/e2e.test" k8s.io/kubernetes/test/e2e
  go build -ldflags "-s -w" -o "$BIN/agnhost" k8s.io/kubernetes/test/images/agnhost
}

# Spindle's own Go testdriver for the same suite (e2e/storage/rbdstatic:
# pre-provisioned RBD volumes, which the YAML testdrivers cannot make), as
# spindle-storage.test: its files copied into a module like the one above,
# where k8s.io/kubernetes/test/e2e can be imported (the spindle module
# cannot require k8s.io/kubernetes; the directory's own go.mod keeps it
# out of the spindle module). Rebuilt when its sources change.
RBDSTATIC=$REPO/e2e/storage/rbdstatic
spindle_storage_e2e() {
  kubernetes_module "$SRC/spindle-storage-e2e"
  mkdir rbdstatic && cp "$RBDSTATIC"/*.go rbdstatic/
  go mod tidy
  go test -c -ldflags "-s -w $(kubernetes_version_x)" -o "$BIN/spindle-storage.test" ./rbdstatic
}

# sidecar MODULE VERSION PKG...
sidecar() {
  local module=$1 version=$2
  shift 2
  scratch_module "$SRC/$(basename "$(dirname "$module")")" "$module" "$version" copy-replaces "$@"
  go build -ldflags "-s -w -X main.version=$version" -o "$BIN/" "$@"
}

provisioner() { sidecar github.com/kubernetes-csi/external-provisioner/v6 "$PROVISIONER" github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner; }
attacher() { sidecar github.com/kubernetes-csi/external-attacher/v4 "$ATTACHER" github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher; }
resizer() { GOBIN=$BIN go install -ldflags '-s -w' "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer@$RESIZER"; }
snapshotter() {
  sidecar github.com/kubernetes-csi/external-snapshotter/v8 "$SNAPSHOTTER" \
    github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter \
    github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller
  # The CRDs (VolumeSnapshot*, VolumeGroupSnapshot*) ship in the client module.
  go mod download "github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER"
  rm -rf "$CACHE/crds" && mkdir -p "$CACHE/crds"
  cp "$GOMODCACHE/github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER"/config/crd/*.yaml "$CACHE/crds/"
  chmod u+w "$CACHE/crds"/*.yaml
  rm -f "$CACHE/crds/kustomization.yaml"
}

start=$SECONDS
step debs 2 debs
step etcd "$ETCD" etcd
step kubernetes "$K8S" kubernetes
# Only a kind node image (hack/kind) needs kubeadm and kube-proxy (KIND_NODE=1).
if [ "${KIND_NODE:-0}" = 1 ]; then
  step kubernetes-node "$K8S" kubernetes_node
fi
step csi-provisioner "$PROVISIONER" provisioner
step csi-attacher "$ATTACHER" attacher
step csi-resizer "$RESIZER" resizer
step csi-snapshotter "$SNAPSHOTTER" snapshotter
# Only `make e2e-storage` needs the e2e suite (E2E_SUITE=1).
if [ "${E2E_SUITE:-0}" = 1 ]; then
  step kubernetes-e2e "$K8S" kubernetes_e2e
  step spindle-storage-e2e "$K8S-$(cat "$RBDSTATIC"/*.go | sha256sum | cut -c1-12)" spindle_storage_e2e
  # The ginkgo CLI runs e2e.test's specs in parallel processes.
  step ginkgo "$GINKGO" env GOBIN="$BIN" go install "github.com/onsi/ginkgo/v2/ginkgo@$GINKGO"
fi
echo "build: local cluster binaries ready in $BIN ($((SECONDS - start))s)" >&2
