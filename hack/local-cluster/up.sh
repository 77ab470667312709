#!/usr/bin/env bash
# Brings up a one-node Kubernetes on this machine with Spindle on it: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, containerd + runc,
# a real kubelet, the Spindle driver (node + controller, loop backend,
# registered with kubelet's plugin watcher by itself) and the sidecars
# csi-provisioner, csi-attacher, csi-resizer, csi-snapshotter with
# snapshot-controller. Everything listens on 127.0.0.1 or unix sockets under
# $CLUSTER_DIR. Needs hack/local-cluster/build.sh and `make build` first.
#
# CONTROLLER_MANAGER_QPS=N raises kube-controller-manager's client limits
# (--kube-api-qps N, --kube-api-burst 2N) from upstream's 20 and 30, which
# every test and benchmark uses unless it is set (`make bench-k8s` measures
# what those limits cost; docs/benchmarks.md).
#
# DEPLOY=process (default) runs the driver and the sidecars as processes on
# the host; DEPLOY=helm installs them with charts/spindle instead; DEPLOY=none
# stops before Spindle (hack/local-cluster/multinode.sh installs it itself,
# once its worker nodes have joined).
#
# This machine's quirks, and what they cost here:
# - kubelet 1.36 refuses cgroup v1 unless failCgroupV1: false (cgroupfs driver);
# - runc cannot set oom_score_adj without CAP_SYS_RESOURCE, so containerd
#   runs with restrict_oom_score_adj;
# - no pod network provider: a bridge on this machine (POD_BRIDGE) with
#   host-local addresses; pods reach this machine, nothing beyond it;
# - no DNS name for the node, and kubelet may not report a loopback address:
#   kubelet listens on every address (client certificates of the cluster's CA
#   only) and the apiserver reaches it at its InternalIP (kubectl exec, logs);
# - no registry: images are assembled by hack/imagetar and imported with ctr.
set -euo pipefail
# shellcheck source=hack/local-cluster/env.sh
. "$(dirname "$0")/env.sh"
SPINDLE=${SPINDLE:-$REPO/bin/spindle}
DEPLOY=${DEPLOY:-process}
case $DEPLOY in process | helm | none) ;; *) echo "up: DEPLOY=$DEPLOY: want process, helm or none" >&2; exit 2 ;; esac
for b in etcd kube-apiserver kubelet kubectl csi-provisioner csi-attacher csi-resizer csi-snapshotter snapshot-controller; do
  [ -x "$BIN/$b" ] || { echo "up: $BIN/$b is missing; run hack/local-cluster/build.sh" >&2; exit 1; }
done
[ -x "$SPINDLE" ] || { echo "up: $SPINDLE is missing; run make build" >&2; exit 1; }
if [ -d "$RUN" ] && ls "$RUN"/*.pid >/dev/null 2>&1; then
  echo "up: a cluster is already running in $CLUSTER_DIR (run hack/local-cluster/down.sh)" >&2
  exit 1
fi
P=$CLUSTER_DIR/pki
mkdir -p "$P" "$LOGS" "$RUN" "$KUBELET_DIR" "$POOL_DIR" "$CLUSTER_DIR/podlogs" "$CLUSTER_DIR/cni/bin" "$CLUSTER_DIR/cni/net.d" "$CLUSTER_DIR/containerd" "$CLUSTER_DIR/images"
start=$SECONDS

# POOL_FS=xfs|btrfs puts the loop pool on a filesystem of its own (a
# sparse image file on a loop device) that can reflink, so snapshots and
# clones of volumes in use work, as docs/volumes.md recommends.
if [ -n "${POOL_FS:-}" ] && ! findmnt -n "$POOL_DIR" >/dev/null; then
  truncate -s "${POOL_SIZE:-64G}" "$CLUSTER_DIR/pool.img"
  case $POOL_FS in
  xfs) mkfs.xfs -q -m reflink=1 "$CLUSTER_DIR/pool.img" ;;
  btrfs) mkfs.btrfs -q "$CLUSTER_DIR/pool.img" ;;
  *) echo "up: POOL_FS=$POOL_FS: want xfs or btrfs" >&2; exit 2 ;;
  esac
  mount -o loop "$CLUSTER_DIR/pool.img" "$POOL_DIR"
fi

# start NAME CMD...: runs CMD in the background, its log in $LOGS/NAME.log.
start() {
  local name=$1
  shift
  "$@" >"$LOGS/$name.log" 2>&1 &
  echo $! >"$RUN/$name.pid"
}
# wait_for DESCRIPTION SECONDS CMD...: polls CMD until it succeeds.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  echo "up: timed out after ${secs}s waiting for $what; logs in $LOGS" >&2
  return 1
}

# --- certificates: a CA, the apiserver's serving cert (also kubelet's), an
# admin client in system:masters, and the service-account key pair.
if [ ! -f "$P/admin.crt" ]; then
  (
    cd "$P"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj /CN=spindle-local-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 30 \
      -extfile <(printf 'subjectAltName=IP:127.0.0.1,IP:192.168.76.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth') 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=admin" 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 30 -extfile <(echo extendedKeyUsage=clientAuth) 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
fi
cat >"$KUBECONFIG" <<KC
apiVersion: v1
kind: Config
clusters: [{name: spindle-local, cluster: {server: "https://127.0.0.1:6443", certificate-authority: $P/ca.crt}}]
users: [{name: admin, user: {client-certificate: $P/admin.crt, client-key: $P/admin.key}}]
contexts: [{name: spindle-local, context: {cluster: spindle-local, user: admin}}]
current-context: spindle-local
KC

# --- control plane
start etcd "$BIN/etcd" --data-dir "$RUN/etcd" --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster default=http://127.0.0.1:2380 --listen-metrics-urls "" --unsafe-no-fsync
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 --bind-address 127.0.0.1 --secure-port 6443 \
  --advertise-address 127.0.0.1 --endpoint-reconciler-type none --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" \
  --client-ca-file "$P/ca.crt" --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$P/sa.pub" \
  --service-account-signing-key-file "$P/sa.key" --service-cluster-ip-range 10.0.0.0/24 --authorization-mode Node,RBAC \
  --allow-privileged=true --kubelet-client-certificate "$P/admin.crt" --kubelet-client-key "$P/admin.key" \
  --kubelet-preferred-address-types InternalIP
wait_for "kube-apiserver /readyz" 120 kubectl get --raw /readyz
common=(--kubeconfig "$KUBECONFIG" --authentication-kubeconfig "$KUBECONFIG" --authorization-kubeconfig "$KUBECONFIG" --bind-address 127.0.0.1 --leader-elect=false)
kcm_limits=()
if [ -n "${CONTROLLER_MANAGER_QPS:-}" ]; then
  kcm_limits=(--kube-api-qps "$CONTROLLER_MANAGER_QPS" --kube-api-burst "$((CONTROLLER_MANAGER_QPS * 2))")
fi
start kube-controller-manager "$BIN/kube-controller-manager" "${common[@]}" --service-account-private-key-file "$P/sa.key" \
  --root-ca-file "$P/ca.crt" --controllers '*' "${kcm_limits[@]}"
start kube-scheduler "$BIN/kube-scheduler" "${common[@]}"

# --- containerd + runc
# --- pod network: one bridge on this machine, host-local addresses, no NAT
# and no route out (the pods talk to this machine only; nothing here needs
# iptables).
cp "$DEBS/usr/lib/cni/"{loopback,bridge,host-local} "$CLUSTER_DIR/cni/bin/"
cat >"$CLUSTER_DIR/cni/net.d/10-spindle-pods.conflist" <<CNI
{"cniVersion":"0.4.0","name":"spindle-pods","plugins":[{"type":"bridge","bridge":"$POD_BRIDGE","isGateway":true,"ipMasq":false,
 "ipam":{"type":"host-local","ranges":[[{"subnet":"$POD_SUBNET"}]],"dataDir":"$CLUSTER_DIR/cni/ipam"}}]}
CNI
cat >"$CLUSTER_DIR/containerd/config.toml" <<CT
version = 2
root = "$CLUSTER_DIR/containerd/root"
state = "$CLUSTER_DIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CONTAINERD_SOCKET"
[ttrpc]
  address = "$CLUSTER_DIR/containerd/containerd-ttrpc.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CLUSTER_DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "local.test/pause:1"
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$DEBS/usr/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CLUSTER_DIR/cni/bin"
    conf_dir = "$CLUSTER_DIR/cni/net.d"
CT
start containerd "$DEBS/usr/bin/containerd" --config "$CLUSTER_DIR/containerd/config.toml"
wait_for containerd 60 ctr version

# --- images: the pause image and the e2e pods' image, one static binary
(cd "$REPO" && CGO_ENABLED=0 go build -trimpath -o "$CLUSTER_DIR/images/spindle-e2e-pod" ./e2e/cmd/spindle-e2e-pod)
(cd "$REPO" && go run ./hack/imagetar -tag local.test/pause:1 -o "$CLUSTER_DIR/images/pause.tar" \
  -file "$CLUSTER_DIR/images/spindle-e2e-pod:/pause" -entrypoint /pause -cmd pause)
(cd "$REPO" && go run ./hack/imagetar -tag local.test/spindle-e2e-pod:1 -o "$CLUSTER_DIR/images/e2e-pod.tar" \
  -file "$CLUSTER_DIR/images/spindle-e2e-pod:/usr/local/bin/spindle-e2e-pod" -entrypoint /usr/local/bin/spindle-e2e-pod)
for img in pause e2e-pod; do ctr -n k8s.io images import "$CLUSTER_DIR/images/$img.tar" >/dev/null; done

# --- kubelet
for k in kernel.panic kernel.panic_on_oops vm.overcommit_memory; do echo "$k=$(sysctl -n $k)"; done >"$RUN/sysctl.saved"
cat >"$CLUSTER_DIR/kubelet-config.yaml" <<KCFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CONTAINERD_SOCKET
address: 0.0.0.0
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $P/ca.crt}}
authorization: {mode: AlwaysAllow}
tlsCertFile: $P/apiserver.crt
tlsPrivateKeyFile: $P/apiserver.key
podLogsDir: $CLUSTER_DIR/podlogs
failSwapOn: false
resolvConf: ""
evictionHard: {"memory.available": "100Mi"}
mergeDefaultEvictionSettings: false
imageGCHighThresholdPercent: 100
syncFrequency: 10s
# kubelet runs on this machine: it must not add its hint, canary and
# KUBE-FIREWALL chains to the machine's iptables (nothing here reads them:
# there is no kube-proxy).
makeIPTablesUtilChains: false
KCFG
start kubelet "$BIN/kubelet" --config "$CLUSTER_DIR/kubelet-config.yaml" --kubeconfig "$KUBECONFIG" --root-dir "$KUBELET_DIR" \
  --cert-dir "$KUBELET_DIR/pki" --hostname-override "$NODE"
node_ready() { [ "$(kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
wait_for "node $NODE Ready" 120 node_ready

# kubelet's directory is a shared mount, as on a real node, so that a node
# plugin in a pod (DEPLOY=helm) can propagate its mounts back with
# Bidirectional propagation; this machine's / is private.
if ! findmnt -n "$KUBELET_DIR" >/dev/null; then
  mount --bind "$KUBELET_DIR" "$KUBELET_DIR"
fi
mount --make-rshared "$KUBELET_DIR"
# So is the chart's node state directory (examples/local-cluster.yaml:
# nodeStateDir), which the node plugin and the attach daemon share with
# Bidirectional propagation.
mkdir -p "$CLUSTER_DIR/node-state"
if ! findmnt -n "$CLUSTER_DIR/node-state" >/dev/null; then
  mount --bind "$CLUSTER_DIR/node-state" "$CLUSTER_DIR/node-state"
fi
mount --make-rshared "$CLUSTER_DIR/node-state"

kubectl apply -f "$CACHE/crds" >/dev/null
kubectl wait --for condition=established --timeout=60s crd/volumesnapshots.snapshot.storage.k8s.io \
  crd/volumegroupsnapshots.groupsnapshot.storage.k8s.io >/dev/null
registered() { [ "$(kubectl get csinode "$NODE" -o jsonpath='{.spec.drivers[?(@.name=="'"$DRIVER_NAME"'")].nodeID}')" = "$NODE" ]; }

if [ "$DEPLOY" = none ]; then
  echo "up: cluster ready in $((SECONDS - start))s without Spindle; export KUBECONFIG=$KUBECONFIG"
  exit 0
fi

if [ "$DEPLOY" = helm ]; then
  # --- Spindle from its Helm chart: driver and sidecars in pods, under the
  # chart's ServiceAccounts and RBAC, images assembled here.
  IMAGES_DIR=$CLUSTER_DIR/images/chart "$REPO/hack/images.sh" all >/dev/null
  for img in "$CLUSTER_DIR"/images/chart/*.tar; do ctr -n k8s.io images import "$img" >/dev/null; done
  "$("$REPO/hack/helm.sh")" install spindle "$REPO/charts/spindle" --namespace kube-system \
    -f "$REPO/charts/spindle/examples/local-cluster.yaml" \
    --set kubeletDir="$KUBELET_DIR" --set "config.backends[0].loop.poolDir=$POOL_DIR" \
    --wait --timeout 3m >/dev/null
  wait_for "kubelet to register $DRIVER_NAME (CSINode $NODE)" 90 registered
  echo "up: cluster ready in $((SECONDS - start))s with Spindle from charts/spindle; export KUBECONFIG=$KUBECONFIG"
  exit 0
fi

# --- Spindle as host processes: the CSIDriver object first, so the first
# attach already goes through a VolumeAttachment.
kubectl apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: $DRIVER_NAME}
spec:
  attachRequired: true
  podInfoOnMount: true
  fsGroupPolicy: File
  volumeLifecycleModes: [Persistent]
YAML
# SPINDLE_CONFIG: a backend configuration file (more backends than the
# loop pool, as `make e2e-storage` uses); without it the loop pool alone.
backends=(--loop-pool-dir "$POOL_DIR")
[ -n "${SPINDLE_CONFIG:-}" ] && backends=(--config "$SPINDLE_CONFIG")
start spindle "$SPINDLE" --mode all --node-id "$NODE" --driver-name "$DRIVER_NAME" --endpoint "unix://$CSI_SOCKET" \
  "${backends[@]}" --plugin-registration-dir "$KUBELET_DIR/plugins_registry" --log-format json \
  --kubelet-dir "$KUBELET_DIR" --metrics-address 127.0.0.1:9808
wait_for "the Spindle socket" 30 test -S "$CSI_SOCKET"
sidecar=(--csi-address "$CSI_SOCKET" --kubeconfig "$KUBECONFIG")
start csi-provisioner "$BIN/csi-provisioner" "${sidecar[@]}" --extra-create-metadata --timeout 60s
start csi-attacher "$BIN/csi-attacher" "${sidecar[@]}" --timeout 60s
start csi-resizer "$BIN/csi-resizer" "${sidecar[@]}" --timeout 60s
start csi-snapshotter "$BIN/csi-snapshotter" "${sidecar[@]}" --timeout 60s --feature-gates=CSIVolumeGroupSnapshot=true
start snapshot-controller "$BIN/snapshot-controller" --kubeconfig "$KUBECONFIG" --feature-gates=CSIVolumeGroupSnapshot=true

kubectl apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: spindle-ext4}
provisioner: $DRIVER_NAME
parameters: {csi.storage.k8s.io/fstype: ext4}
allowVolumeExpansion: true
volumeBindingMode: Immediate
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: spindle-xfs}
provisioner: $DRIVER_NAME
parameters: {csi.storage.k8s.io/fstype: xfs}
allowVolumeExpansion: true
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: spindle}
driver: $DRIVER_NAME
deletionPolicy: Delete
YAML
wait_for "kubelet to register $DRIVER_NAME (CSINode $NODE)" 60 registered
echo "up: cluster ready in $((SECONDS - start))s; export KUBECONFIG=$KUBECONFIG"
