#!/usr/bin/env bash
# hack/kind/node-image.sh: a kind node image of Kubernetes $K8S built
# without a registry, from the local cluster's Kubernetes build, Debian's
# packages and the Go module proxy; prints its name. hack/kind-e2e.sh uses
# it where kindest/node cannot be pulled.
#
# Three steps, each cached as a Docker image (or archives) labelled with
# its pins (versions, and the code of the step and its scripts): a step
# runs again only when one of them changes.
#
# 1. base ($BASE_TAG): what kind's images/base/Dockerfile builds, from
#    Debian $SUITE by mmdebstrap (systemd, containerd, runc, the CNI
#    plugins, iptables/nftables, mount tools...) and kind's own files
#    (entrypoint, units, containerd's config) from the kind module, plus
#    crictl from its Go module; base-customize.sh says what else and why.
#    Debian 12, not kind's Debian 13: its systemd still boots on cgroup v1,
#    which this machine has.
# 2. the images a node runs, as archives, under the names kubeadm asks for
#    (`kubeadm config images list`) and containerd's sandbox image (kind's
#    containerd config): kube-apiserver, -controller-manager, -scheduler and
#    etcd (static binaries, no base), CoreDNS (hack/kind/coredns, the
#    plugins kubeadm's Corefile uses), pause (e2e/cmd/spindle-e2e-pod's
#    pause) and kube-proxy (on Debian minbase with nftables: the cluster's
#    kube-proxy runs in nftables mode). The Kubernetes binaries and etcd are
#    hack/local-cluster/build.sh's (KIND_NODE=1 adds kubeadm and kube-proxy).
# 3. the node ($NODE_TAG), assembled as `kind build node-image` does
#    (which cannot work offline: it pulls etcd, CoreDNS, pause and kind's
#    own images): a container of the base gets kubeadm, kubelet and kubectl,
#    /kind/version, the archives imported into its containerd (pinned), and
#    is committed. On a cgroup v1 host kubelet gets --fail-cgroupv1=false
#    (kubelet >= 1.35 refuses cgroup v1 without it).
#
# Env: K8S (v1.36.3), KIND_VERSION (v0.33.0), SUITE (bookworm), CRICTL_VERSION
# (v1.34.0), MIRROR (the host's first Debian mirror), CACHE (~/.cache/spindle).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
K8S=${K8S:-v1.36.3}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
SUITE=${SUITE:-bookworm}
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spindle}
KUBE_BIN=$CACHE/local-cluster/bin
WORK=$CACHE/kind
BASE_TAG=local.test/kind-base:$SUITE
NODE_TAG=local.test/kind-node:$K8S
LABEL=dev.spindle.pins
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
GOMODCACHE=$(go env GOMODCACHE)
export GOMODCACHE GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath DOCKER_BUILDKIT=0
mkdir -p "$WORK/bin" "$WORK/images"
log() { echo "node-image: $*" >&2; }

# pins NAME TEXT...: the pins of a step, with the code of its function.
pins() {
  local name=$1
  shift
  printf '%s %s' "$*" "$(declare -f "$name" | sha256sum | cut -c1-12)"
}
image_pins() { docker image inspect -f "{{with .Config.Labels}}{{index . \"$LABEL\"}}{{end}}" "$1" 2>/dev/null || true; }

# shellcheck source=hack/kind/debian.sh
. "$HERE/debian.sh"

KIND_NODE=1 "$REPO/hack/local-cluster/build.sh" >&2 </dev/null
go mod download "sigs.k8s.io/kind@$KIND_VERSION"
KIND_SRC=$GOMODCACHE/sigs.k8s.io/kind@$KIND_VERSION

# --- 1. base ------------------------------------------------------------------
base() {
  local crictl=$WORK/bin/crictl-$CRICTL_VERSION no_sys_resource=0 bnd
  if [ ! -x "$crictl" ]; then
    GOBIN=$WORK/bin/crictl-build go install -ldflags '-s -w' "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
    mv "$WORK/bin/crictl-build/crictl" "$crictl" && rmdir "$WORK/bin/crictl-build"
  fi
  # CAP_SYS_RESOURCE is capability 24.
  bnd=$(awk '/^CapBnd/{print $2}' /proc/self/status)
  (((0x$bnd >> 24) & 1)) || no_sys_resource=1
  KIND_FILES=$KIND_SRC/images/base/files CRICTL=$crictl NO_SYS_RESOURCE=$no_sys_resource \
    debian_rootfs "$SUITE" "$WORK/base-rootfs.tar" --variant=apt \
    --include=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,xfsprogs,bash,ca-certificates,curl,jq,procps,open-iscsi,nfs-common,containerd,runc,containernetworking-plugins \
    --customize-hook="$HERE/base-customize.sh"
  # `docker import --change` takes no STOPSIGNAL before Docker 25: a
  # one-line build on the imported filesystem adds it (the legacy builder
  # uses the local image and asks no registry).
  docker import --change 'ENV container=docker' --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
    "$WORK/base-rootfs.tar" "$BASE_TAG-rootfs" >/dev/null
  printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\nLABEL %s="%s"\n' "$BASE_TAG-rootfs" "$LABEL" "$base_pins" |
    docker build -q -t "$BASE_TAG" - >/dev/null
  docker rmi "$BASE_TAG-rootfs" >/dev/null
  rm -f "$WORK/base-rootfs.tar"
}
base_pins=$(pins base "kind=$KIND_VERSION suite=$SUITE crictl=$CRICTL_VERSION" "$(sha256sum "$HERE/base-customize.sh" | cut -c1-12)")
if [ "$(image_pins "$BASE_TAG")" != "$base_pins" ]; then
  log "building $BASE_TAG"
  start=$SECONDS
  base
  log "$BASE_TAG built in $((SECONDS - start))s"
fi

# --- 2. the node's images -------------------------------------------------------
mapfile -t KUBEADM_IMAGES < <("$KUBE_BIN/kubeadm" config images list --kubernetes-version "$K8S")
image_for() { printf '%s\n' "${KUBEADM_IMAGES[@]}" | grep -E "/$1:" | head -n1; }
SANDBOX_IMAGE=$(sed -n 's/^[[:space:]]*sandbox_image = "\(.*\)"/\1/p' "$KIND_SRC/images/base/files/etc/containerd/config.toml")
[ -n "$SANDBOX_IMAGE" ] || { log "no sandbox_image in kind's containerd config"; exit 1; }
COREDNS=$(image_for coredns/coredns | sed 's/.*://')
images() {
  local out=$WORK/images c
  rm -f "$out"/*.tar
  imagetar() { (cd "$REPO" && go run ./hack/imagetar "$@"); }
  for c in kube-apiserver kube-controller-manager kube-scheduler etcd; do
    imagetar -tag "$(image_for "$c")" -o "$out/$c.tar" -file "$KUBE_BIN/$c:/usr/local/bin/$c" -entrypoint "/usr/local/bin/$c"
  done

  local src=$WORK/src/coredns
  rm -rf "$src" && mkdir -p "$src" && cp "$HERE/coredns/go.mod" "$HERE/coredns/main.go" "$src/"
  (cd "$src" && go mod edit -require "github.com/coredns/coredns@$COREDNS" && go mod tidy &&
    go build -ldflags '-s -w' -o "$WORK/bin/coredns" .)
  imagetar -tag "$(image_for coredns/coredns)" -o "$out/coredns.tar" -file "$WORK/bin/coredns:/coredns" -entrypoint /coredns

  (cd "$REPO" && go build -ldflags '-s -w' -o "$WORK/bin/pause" ./e2e/cmd/spindle-e2e-pod)
  imagetar -tag "$(image_for pause)" -o "$out/pause.tar" -file "$WORK/bin/pause:/pause" -entrypoint /pause -cmd pause
  if [ "$SANDBOX_IMAGE" != "$(image_for pause)" ]; then
    imagetar -tag "$SANDBOX_IMAGE" -o "$out/sandbox.tar" -file "$WORK/bin/pause:/pause" -entrypoint /pause -cmd pause
  fi

  debian_rootfs "$SUITE" "$WORK/kube-proxy-rootfs.tar" --variant=minbase --include=nftables,iptables,conntrack,iproute2 \
    --customize-hook="install -D -m 0755 $KUBE_BIN/kube-proxy \"\$1/usr/local/bin/kube-proxy\"" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*'
  docker import --change 'ENTRYPOINT ["/usr/local/bin/kube-proxy"]' "$WORK/kube-proxy-rootfs.tar" "$(image_for kube-proxy)" >/dev/null
  docker save -o "$out/kube-proxy.tar" "$(image_for kube-proxy)"
  docker rmi "$(image_for kube-proxy)" >/dev/null
  rm -f "$WORK/kube-proxy-rootfs.tar"
  echo "$images_pins" >"$out/pins"
}
images_pins=$(pins images "k8s=$K8S suite=$SUITE images=${KUBEADM_IMAGES[*]} sandbox=$SANDBOX_IMAGE" \
  "$(cat "$KUBE_BIN"/{kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy,etcd} "$HERE/coredns/main.go" | sha256sum | cut -c1-12)")
if [ "$(cat "$WORK/images/pins" 2>/dev/null)" != "$images_pins" ]; then
  log "building the node's images"
  start=$SECONDS
  images
  log "images built in $((SECONDS - start))s: $(du -sh "$WORK/images" | cut -f1)"
fi

# --- 3. the node -----------------------------------------------------------------
build_container=spindle-kind-build-$$
trap 'docker rm -f -v "$build_container" >/dev/null 2>&1 || true' EXIT
node() {
  local id=$build_container b f
  docker run -d --name "$id" --entrypoint sleep "$BASE_TAG" infinity >/dev/null
  x() { docker exec -i "$id" "$@"; }
  for b in kubeadm kubelet kubectl; do docker cp "$KUBE_BIN/$b" "$id:/usr/bin/$b"; done
  x chown root:root /usr/bin/kubeadm /usr/bin/kubelet /usr/bin/kubectl
  printf '%s' "$K8S" | x sh -c 'cat >/kind/version'
  # kind applies this manifest; its local-path provisioner is not built here,
  # and the e2e tests bring their own StorageClasses.
  x mkdir -p /kind/manifests
  x sh -c 'cat >/kind/manifests/default-storage.yaml' <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata: {name: kind-default-storage, namespace: kube-system}
data: {note: "no default StorageClass: this node image has no local-path provisioner"}
EOF
  if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
    x sed -i '/^KUBELET_EXTRA_ARGS=/ s/$/ --fail-cgroupv1=false/' /etc/default/kubelet
  fi
  x sh -c 'containerd >/tmp/containerd.log 2>&1 &'
  x sh -c 'for i in $(seq 30); do ctr version >/dev/null 2>&1 && exit 0; sleep 1; done; cat /tmp/containerd.log; exit 1'
  for f in "$WORK"/images/*.tar; do
    x ctr -n k8s.io images import --all-platforms --no-unpack - <"$f" >/dev/null
  done
  x sh -c 'for i in $(ctr -n k8s.io images ls -q); do ctr -n k8s.io images label "$i" io.cri-containerd.pinned=pinned >/dev/null; done'
  x ctr -n k8s.io images ls -q | grep -v '^sha256:' | sed 's/^/node-image:   /' >&2
  # containerd's database closed before the commit. (It stays a zombie: the
  # container's PID 1 is sleep, which reaps nothing.)
  x pkill -x containerd
  x sh -c 'for i in $(seq 30); do ps -C containerd -o stat= | grep -q "^[^Z]" || exit 0; sleep 1; done; exit 1'
  x rm -f /tmp/containerd.log
  docker commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change "LABEL $LABEL=\"$node_pins\"" \
    "$id" "$NODE_TAG" >/dev/null
  docker rm -f -v "$id" >/dev/null
}
node_pins=$(pins node "k8s=$K8S base=$base_pins images=$images_pins" \
  "$(cat "$KUBE_BIN"/{kubeadm,kubelet,kubectl} | sha256sum | cut -c1-12)")
if [ "$(image_pins "$NODE_TAG")" != "$node_pins" ]; then
  log "building $NODE_TAG"
  start=$SECONDS
  node
  log "$NODE_TAG built in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$NODE_TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
fi
echo "$NODE_TAG"
