#!/usr/bin/env bash
# `make e2e-kind`: Spindle's Kubernetes e2e tests (e2e/kubernetes and the
# chart's cluster tests, the same as `make e2e`) in a kind cluster of a
# control plane and two workers that share the host's /dev (loop devices)
# and one loop pool (hack/kind/config.yaml), with Spindle installed by
# charts/spindle. Ends with "N passed, M failed"; the cluster is always
# deleted, and the host must be left as it was found (hack/kind/host-state.sh
# before and after; a difference fails the run).
#
#   1. Docker: the one that runs, else Debian's dockerd started with the
#      firewall and forwarding untouched (hack/kind/docker.sh), stopped again.
#   2. kind $KIND_VERSION, `go install`ed from the Go module proxy (cached).
#   3. Images, KIND_IMAGES=stock|offline (default: stock when the node image
#      below can be pulled, else offline):
#      stock    kindest/node $STOCK_NODE_IMAGE, the sidecars the chart names
#               (registry.k8s.io), pulled by Docker and the nodes;
#      offline  the node image built by hack/kind/node-image.sh from the local
#               cluster's Kubernetes build, the sidecars from its builds
#               (hack/images.sh) under the names the chart's defaults give;
#               no node-driver-registrar or livenessprobe (neither is served
#               by the Go module proxy here): the driver registers itself
#               (node.registration=driver) and the liveness probe is off.
#      Either way the driver image is built from the Dockerfile
#      (hack/kind/driver-image.sh) and loaded into the nodes with the e2e
#      pods' image (hack/imagetar).
#   4. The cluster (kind create cluster), its pod network (hack/kind/network.sh),
#      the snapshot CRDs, `helm install` of charts/spindle with its default
#      values and hack/kind/values.yaml, then the tests against it: every
#      check through the API server, pods on $KIND_CLUSTER-worker.
#   5. The cluster deleted (KEEP=1 keeps it, for working on the tests; a
#      failed run's logs go to $STATE/logs), loop devices left on the pool's
#      images detached, the pool emptied, /lib/modules (which kind mounts
#      into every node) removed if it was made here, the sysctls kubelet
#      sets for the whole machine (kernel.panic, vm.overcommit_memory, ...)
#      and those the nodes' systemd raises (fs.file-max, fs.nr_open)
#      put back, Docker stopped if it was started here.
#
# Needs root (hack/install-deps.sh kind installs the packages). Prints each
# phase's time and the nodes' memory.
#
#   hack/kind-e2e.sh         the whole run
#   hack/kind-e2e.sh down    step 5 alone: what a KEEP=1 run left (the
#                            cluster, Docker) deleted and the host compared
#
# Env: KIND_CLUSTER (spindle), KIND_IMAGES, KEEP, E2E_RUN (go test -run),
# DRIVER_IMAGE_FROM (dockerfile; assembled: hack/images.sh's, no build),
# CACHE (~/.cache/spindle: kind, the offline images' parts). The run's
# state (the pool, kubeconfig, logs, a started Docker's data) is in
# /var/tmp/spindle-kind.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
K=$REPO/hack/kind
# shellcheck source=hack/test-results.sh
. "$REPO/hack/test-results.sh"
NAME=${KIND_CLUSTER:-spindle}
KIND_VERSION=v0.33.0
# The image kind v0.33.0 was released with for Kubernetes 1.36 (its release
# notes; the digest pins the build for that kind).
STOCK_NODE_IMAGE=kindest/node:v1.36.4@sha256:099e049362a1526b2db71494e1947aae99bd16290d7c895f2b7ea312e3cbfaed
STATE=/var/tmp/spindle-kind # hack/kind/config.yaml names $STATE/pool
POOL=$STATE/pool
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spindle}
KIND=$CACHE/kind/kind-$KIND_VERSION/kind
DRIVER_IMAGE=local.test/spindle:kind
SNAPSHOTTER=${SNAPSHOTTER:-v8.7.0} # the CRDs' version, as hack/local-cluster/build.sh
export KUBECONFIG=$STATE/kubeconfig
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
cd "$REPO" || exit 1
mkdir -p "$STATE"
phase() { echo "e2e-kind: $1 took $(($2))s"; }
fail() {
  echo "e2e-kind: $*"
  exit 1
}

# --- everything from here on is undone by cleanup, which prints the result -----
made_modules=
[ ! -f "$STATE/made-modules" ] || made_modules=1
cleanup() {
  local code=$? t=$SECONDS
  [ "$code" -eq 0 ] || failed=${failed:-1}
  if [ -n "${kind_ready:-}" ] && "$KIND" get clusters 2>/dev/null | grep -qx "$NAME"; then
    if [ "${failed:-1}" -gt 0 ]; then
      rm -rf "$STATE/logs" && "$KIND" export logs "$STATE/logs" --name "$NAME" >/dev/null 2>&1 &&
        echo "e2e-kind: the cluster's logs are in $STATE/logs"
    fi
    if [ "${KEEP:-0}" = 1 ]; then
      echo "e2e-kind: KEEP=1: the cluster stays (KUBECONFIG=$KUBECONFIG); $0 deletes it, or: $KIND delete cluster --name $NAME"
      echo "${passed:-0} passed, ${failed:-1} failed"
      exit 1
    fi
    "$KIND" delete cluster --name "$NAME" --kubeconfig "$KUBECONFIG" >/dev/null 2>&1
  fi
  # A volume a failed test left attached keeps its loop device after its
  # node is gone: detach those on the pool's images (by inode), then empty it.
  local dev ino majmin f
  while read -r dev ino majmin; do
    for f in "$POOL"/*; do
      [ -f "$f" ] && [ "$(stat -c '%i %Hd:%Ld' "$f")" = "$ino $majmin" ] && losetup -d "$dev" && echo "e2e-kind: detached $dev (left on $f)"
    done
  done < <(losetup -l -n -O NAME,BACK-INO,BACK-MAJ:MIN 2>/dev/null)
  rm -rf "$POOL"
  [ -z "$made_modules" ] || { rmdir /lib/modules && rm -f "$STATE/made-modules"; }
  # What kubelet and the nodes' systemd set for the whole machine.
  if [ -f "$STATE/sysctl.saved" ]; then
    while read -r setting; do sysctl -q -w "$setting"; done <"$STATE/sysctl.saved"
    rm -f "$STATE/sysctl.saved"
  fi
  [ -z "${made_kind_network:-}" ] || docker network rm kind >/dev/null 2>&1
  "$K/docker.sh" stop
  phase "clean-up" $((SECONDS - t))
  "$K/host-state.sh" >"$STATE/host.after"
  if [ ! -f "$STATE/host.before" ]; then
    : # failed before anything was changed
  elif ! diff -u "$STATE/host.before" "$STATE/host.after" >"$STATE/host.diff"; then
    echo "e2e-kind: the host is not as it was before the run ($STATE/host.diff):"
    cat "$STATE/host.diff"
    failed=$((${failed:-0} + 1))
  else
    echo "e2e-kind: the host is as it was (iptables, sysctls, loop devices, mounts, bridges)"
  fi
  rm -f "$STATE/host.before"
  echo "${passed:-0} passed, ${failed:-1} failed"
  [ "${failed:-1}" -eq 0 ] || exit 1
}
trap cleanup EXIT

if [ "${1:-}" = down ]; then
  [ -f "$STATE/host.before" ] || echo "e2e-kind: no record of the host before the run ($STATE/host.before): not compared"
  kind_ready=1 KEEP=0 failed=${failed:-0}
  exit 0
fi
t=$SECONDS
rm -f "$STATE/host.before"
"$REPO/hack/install-deps.sh" kind || fail "installing the packages failed"
"$K/host-state.sh" >"$STATE/host.before"

"$K/docker.sh" start || exit 1
if [ ! -x "$KIND" ]; then
  GOBIN=$(dirname "$KIND") go install "sigs.k8s.io/kind@$KIND_VERSION" || exit 1
fi
make --no-print-directory build >/dev/null || exit 1
HELM=$("$REPO/hack/helm.sh") || exit 1
phase "set-up (packages, Docker, kind, the driver's binaries)" $((SECONDS - t))

# --- images -----------------------------------------------------------------
t=$SECONDS
mode=${KIND_IMAGES:-auto}
if [ "$mode" = auto ]; then
  mode=offline
  if docker image inspect "$STOCK_NODE_IMAGE" >/dev/null 2>&1 || timeout 300 docker pull -q "$STOCK_NODE_IMAGE" >/dev/null 2>&1; then
    mode=stock
  fi
fi
helm_args=(--set "driver.image.tag=${DRIVER_IMAGE#*:}")
case $mode in
stock)
  node_image=$STOCK_NODE_IMAGE
  ;;
offline)
  node_image=$("$K/node-image.sh") || exit 1
  # The sidecars from the local cluster's builds, under the chart's names.
  IMAGES_DIR=$STATE/images "$REPO/hack/images.sh" sidecars 2>/dev/null || exit 1
  helm_args+=(--set node.registration=driver --set sidecars.livenessProbe.enabled=false)
  ;;
*) fail "KIND_IMAGES=$mode: want stock or offline" ;;
esac
# DRIVER_IMAGE_FROM=assembled: the image `make e2e` runs (hack/images.sh,
# no Docker build), for a quick run while working on the tests.
case ${DRIVER_IMAGE_FROM:-dockerfile} in
dockerfile) "$K/driver-image.sh" "$DRIVER_IMAGE" || exit 1 ;;
assembled)
  IMAGES_DIR=$STATE/images TAG=${DRIVER_IMAGE#*:} "$REPO/hack/images.sh" driver 2>/dev/null &&
    docker load -q -i "$STATE/images/spindle.tar" >/dev/null || exit 1
  ;;
*) fail "DRIVER_IMAGE_FROM=${DRIVER_IMAGE_FROM}: want dockerfile or assembled" ;;
esac
mkdir -p "$STATE/images"
CGO_ENABLED=0 go build -trimpath -o "$STATE/images/spindle-e2e-pod" ./e2e/cmd/spindle-e2e-pod &&
  go run ./hack/imagetar -tag local.test/spindle-e2e-pod:1 -o "$STATE/images/e2e-pod.tar" \
    -file "$STATE/images/spindle-e2e-pod:/usr/local/bin/spindle-e2e-pod" -entrypoint /usr/local/bin/spindle-e2e-pod || exit 1
# Every image the installation runs, from the chart itself.
mapfile -t chart_images < <("$HELM" template spindle charts/spindle -f hack/kind/values.yaml "${helm_args[@]}" |
  sed -n 's/^ *image: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' | sort -u)
load=("$DRIVER_IMAGE")
if [ "$mode" = offline ]; then
  for image in "${chart_images[@]}"; do
    [ "$image" != "$DRIVER_IMAGE" ] || continue
    built=local.test/$(basename "${image%%:*}"):${image##*:}
    [ -f "$STATE/images/$(basename "${image%%:*}").tar" ] || fail "$image: no such sidecar among hack/images.sh's"
    docker load -q -i "$STATE/images/$(basename "${image%%:*}").tar" >/dev/null || exit 1
    if ! docker image inspect "$built" >/dev/null 2>&1; then
      fail "$image: hack/images.sh built another version than the chart names"
    fi
    docker tag "$built" "$image" && load+=("$image")
  done
fi
phase "images ($mode)" $((SECONDS - t))

# --- the cluster ----------------------------------------------------------------
t=$SECONDS
mkdir -p "$POOL"
if [ ! -e /lib/modules ]; then mkdir /lib/modules && made_modules=1 && : >"$STATE/made-modules"; fi
# kubelet sets the first four for the whole machine (as the local
# cluster's does); each node's systemd raises fs.file-max and fs.nr_open
# as it boots (its /proc/sys is writable, and they are not per namespace:
# seen here, fs.file-max 2466174 -> 9223372036854775807).
for s in kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom fs.file-max fs.nr_open; do
  echo "$s=$(sysctl -n "$s")"
done >"$STATE/sysctl.saved"
docker network inspect kind >/dev/null 2>&1 || made_kind_network=1
"$KIND" delete cluster --name "$NAME" >/dev/null 2>&1 # one a killed run left
kind_ready=1
"$KIND" create cluster --name "$NAME" --config hack/kind/config.yaml --image "$node_image" \
  --kubeconfig "$KUBECONFIG" --retain || exit 1
# The nodes' own kubectl, for this script and the tests (the chart's
# dry run), where the machine has none.
mkdir -p "$STATE/bin" && docker cp "$NAME-control-plane:/usr/bin/kubectl" "$STATE/bin/kubectl" >/dev/null || exit 1
export KUBECTL=$STATE/bin/kubectl PATH="$PATH:$STATE/bin"
k() { "$KUBECTL" "$@"; }
"$K/network.sh" || exit 1
phase "cluster up" $((SECONDS - t))

t=$SECONDS
"$KIND" load docker-image --name "$NAME" "${load[@]}" >/dev/null 2>&1 || exit 1
"$KIND" load image-archive --name "$NAME" "$STATE/images/e2e-pod.tar" >/dev/null || exit 1
go mod download "github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER" || exit 1
for f in "$(go env GOMODCACHE)/github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER"/config/crd/*.yaml; do
  case $f in */kustomization.yaml) ;; *) k apply -f "$f" >/dev/null || exit 1 ;; esac
done
k wait --for condition=established --timeout=60s crd/volumesnapshots.snapshot.storage.k8s.io >/dev/null || exit 1
"$HELM" install spindle charts/spindle --namespace kube-system --wait --timeout 5m \
  -f hack/kind/values.yaml "${helm_args[@]}" >/dev/null || exit 1
for node in "$NAME-worker" "$NAME-worker2"; do
  for _ in $(seq 120); do
    [ "$(k get csinode "$node" -o jsonpath='{.spec.drivers[?(@.name=="spindle.csi.dev")].nodeID}' 2>/dev/null)" = "$node" ] && break
    sleep 1
  done
done
phase "Spindle installed" $((SECONDS - t))

# --- the tests --------------------------------------------------------------------
t=$SECONDS
out=$STATE/tests.log
# The nodes' memory, sampled while the tests run.
mapfile -t nodes < <("$KIND" get nodes --name "$NAME")
(while sleep 10; do docker stats --no-stream --format '{{.Name}} {{.MemUsage}}' "${nodes[@]}"; done) >"$STATE/memory.log" 2>/dev/null &
sampler=$!
# Not run here (a skipped test counts as failed, hack/test-results.sh):
# the Rook tests need the throw-away Ceph `make e2e` starts on the machine
# for the driver as host processes, which the chart's pods in kind's nodes
# do not reach; the chart's sidecar flags are checked against the local
# cluster's builds of the sidecars, which a run with stock images may not
# have.
not_here=(TestAdoptCephCSIVolume TestMonitorMoveNeedsNoRestart TestRookStorageClassUnchanged)
echo "e2e-kind: not run here (no Ceph the driver in kind reaches): ${not_here[*]}"
if [ ! -x "$CACHE/local-cluster/bin/csi-provisioner" ]; then
  echo "e2e-kind: no sidecar builds in $CACHE/local-cluster/bin: TestSidecarsKnowTheirFlags is not run"
  not_here+=(TestSidecarsKnowTheirFlags)
fi
run=()
[ -z "${E2E_RUN:-}" ] || run=(-run "$E2E_RUN")
SPINDLE_E2E_KUBECONFIG=$KUBECONFIG SPINDLE_E2E_NODE=$NAME-worker SPINDLE_HELM=$HELM \
  go test -count=1 -v -timeout 30m -tags "cluster root" -skip "^($(IFS='|'; echo "${not_here[*]}"))\$" "${run[@]}" ./e2e/kubernetes/ ./e2e/chart/ 2>&1 | tee "$out"
kill "$sampler" 2>/dev/null
phase "tests" $((SECONDS - t))
count_results "$out"
echo "e2e-kind: the nodes' memory (the most seen while the tests ran):"
awk '{ n = $2 + 0; u = $2; sub(/^[0-9.]+/, "", u)
       if (u == "GiB") n *= 1024; else if (u == "KiB") n /= 1024; else if (u == "B") n /= 1048576
       if (n > m[$1]) m[$1] = n }
     END { for (x in m) printf "  %s: %.0f MiB\n", x, m[x] }' "$STATE/memory.log" | sort
