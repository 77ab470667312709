#!/bin/bash
# Runs IN a qemu guest (hack/vm/run.sh's run.sh, from the worker's share at
# /mnt/share) and makes it a worker node of the local cluster: containerd +
# runc and a real kubelet joined to the control plane on the host, until the
# host asks it to stop (hack/local-cluster/workers.sh down) or kills it.
#
# The share (workers.sh writes it) holds:
#   node.env   NODE_NAME NODE_IP GATEWAY POD_SUBNET APISERVER, SHARED_DIRS
#              ("TAG=DIR ...": the host's directories to mount at DIR)
#   bin/       kubelet, containerd, containerd-shim-runc-v2, runc, ctr
#   cni/       the CNI plugins (bridge, host-local, loopback)
#   pki/       ca.crt, the node's client certificate (system:node:NAME) and
#              serving certificate (its IP)
#   images/    image tarballs, imported once (the node's disk keeps them)
#   stop       created by the host: stop kubelet and containerd, power off
#   exec/      for debugging a node: the host drops NAME.sh there; the guest
#              runs it once and leaves NAME.out (output) and NAME.rc
#              (workers.sh exec NAME CMD... does all that)
#
# The node's own state (containerd's images and snapshots, kubelet's root)
# lives on the guest's second disk, /dev/vdb, which persists across boots as
# a real node's disk would; the root filesystem is a throw-away overlay.
set -euo pipefail
export LC_ALL=C
SHARE=/mnt/share
OUT=$SHARE/out
# shellcheck source=/dev/null
. "$SHARE/node.env"
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
t0=$(cut -d' ' -f1 /proc/uptime)
say() { echo "worker $NODE_NAME [$(cut -d' ' -f1 /proc/uptime)s]: $*"; }

hostname "$NODE_NAME"
echo "$NODE_NAME" >/etc/hostname
printf '127.0.0.1 localhost\n%s %s\n' "$NODE_IP" "$NODE_NAME" >/etc/hosts
# Each node its own initiator name (the image has one for every guest).
echo "InitiatorName=iqn.2026-01.dev.spindle.guest:$NODE_NAME" >/etc/iscsi/initiatorname.iscsi
# The default route to the host's side of the guests' network, so that the
# apiserver forwarder and the pod subnets of other nodes are reachable.
ip route replace default via "$GATEWAY"
sysctl -qw net.ipv4.ip_forward=1
modprobe -q overlay
modprobe -q br_netfilter || true

# --- shared storage: the host's directories over 9p, at the same paths.
for spec in ${SHARED_DIRS:-}; do
  mkdir -p "${spec#*=}"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 "${spec%%=*}" "${spec#*=}"
done

# --- the node's disk: formatted once (never when it holds any signature).
DATA=/var/lib/spindle-node
mkdir -p "$DATA"
if [ -z "$(blkid -p -o value -s TYPE /dev/vdb 2>/dev/null || true)" ] &&
  [ -z "$(blkid -p -o value -s PTTYPE /dev/vdb 2>/dev/null || true)" ]; then
  say "formatting the node disk /dev/vdb"
  mkfs.ext4 -q -L spindle-node /dev/vdb
fi
mount /dev/vdb "$DATA"
mkdir -p "$DATA/containerd" "$DATA/kubelet" /var/lib/containerd /var/lib/kubelet
mount --bind "$DATA/containerd" /var/lib/containerd
mount --bind "$DATA/kubelet" /var/lib/kubelet
# Mount propagation for the node plugin's Bidirectional mounts.
mount --make-rshared /var/lib/kubelet
# The programs, copied to the node's disk when they changed: run from the
# 9p share, runc hung in 9p reads under load and pods could not be killed.
for dir in bin cni; do
  mkdir -p "$DATA/$dir"
  for f in "$SHARE/$dir"/*; do
    local_copy=$DATA/$dir/$(basename "$f")
    [ "$(stat -c %s.%Y "$f")" = "$(stat -c %s.%Y "$local_copy" 2>/dev/null)" ] || cp -p "$f" "$local_copy"
  done
done
export PATH="$DATA/bin:$PATH"
mkdir -p /etc/kubernetes/pki /etc/cni/net.d /run/containerd
cp "$SHARE"/pki/* /etc/kubernetes/pki/

# --- containerd + runc (systemd cgroups: the guest runs systemd, cgroup v2)
# containerd, its shims, the runc they run and kubelet live in this run's
# service, under system.slice; the pods live in kubepods.slice, whose CPU
# weight kubelet sets from the node's CPUs (79 for 2). On an emulated
# worker under load (run N: load 15 on 2 vCPUs), the pods' work took the
# CPU that runc needed to delete an exited container within containerd's
# 10 s, for minutes (docs/results/2026-11-29-testing-history.md, runs N, O and V): replacing a node
# plugin pod took up to 9 minutes and a helm upgrade ran out. The pods'
# work includes the userspace attachers' (rbd-nbd, rbd-fuse,
# qemu-storage-daemon in the attach daemon's pod), so the weight is a
# balance: at 500 (run W) pods were replaced in about a minute, but
# rbd-nbd's writer paused 11.7 s while helm upgrade replaced them; at 200
# (runs X and Y) within 1.5 minutes, the userspace writers' pauses under
# 4.1 s.
# SYSTEM_CPU_WEIGHT is workers.sh's WORKER_SYSTEM_CPU_WEIGHT.
if systemctl set-property --runtime system.slice CPUWeight="$SYSTEM_CPU_WEIGHT" 2>/dev/null; then
  say "system.slice CPU weight $(cat /sys/fs/cgroup/system.slice/cpu.weight 2>/dev/null || echo unknown)"
else
  say "could not set system.slice's CPU weight; containerd competes with the pods"
fi
cat >/etc/containerd.toml <<CT
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "local.test/pause:1"
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$DATA/bin/runc"
        SystemdCgroup = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$DATA/cni"
    conf_dir = "/etc/cni/net.d"
CT
# The pods' default route is the node (the bridge's address), which routes
# to this machine and, through it, to the other nodes' pods.
cat >/etc/cni/net.d/10-spindle-pods.conflist <<CNI
{"cniVersion":"0.4.0","name":"spindle-pods","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":false,
 "ipam":{"type":"host-local","ranges":[[{"subnet":"$POD_SUBNET"}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":"/var/lib/spindle-node/cni-ipam"}}]}
CNI
containerd --config /etc/containerd.toml >"$OUT/containerd.log" 2>&1 &
for _ in $(seq 1 240); do ctr version >/dev/null 2>&1 && break; sleep 0.25; done
ctr version >/dev/null || { say "containerd did not start"; tail "$OUT/containerd.log"; exit 1; }
say "containerd up"

# --- images: imported once; a tarball whose stamp matches is skipped.
for tar in "$SHARE"/images/*.tar; do
  [ -e "$tar" ] || continue
  stamp=$DATA/imported.$(basename "$tar").$(stat -c %s.%Y "$tar")
  [ -e "$stamp" ] && continue
  ctr -n k8s.io images import "$tar" >/dev/null
  rm -f "$DATA/imported.$(basename "$tar")".*
  touch "$stamp"
  say "imported $(basename "$tar")"
done

# --- kubelet
cat >/etc/kubernetes/kubeconfig <<KC
apiVersion: v1
kind: Config
clusters: [{name: spindle-local, cluster: {server: "$APISERVER", certificate-authority: /etc/kubernetes/pki/ca.crt}}]
users: [{name: node, user: {client-certificate: /etc/kubernetes/pki/node-client.crt, client-key: /etc/kubernetes/pki/node-client.key}}]
contexts: [{name: spindle-local, context: {cluster: spindle-local, user: node}}]
current-context: spindle-local
KC
cat >/etc/kubernetes/kubelet.yaml <<KCFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}}
authorization: {mode: AlwaysAllow}
tlsCertFile: /etc/kubernetes/pki/node-serving.crt
tlsPrivateKeyFile: /etc/kubernetes/pki/node-serving.key
failSwapOn: false
resolvConf: ""
evictionHard: {"memory.available": "50Mi"}
mergeDefaultEvictionSettings: false
# The images are imported, never pulled: garbage collection would lose them.
imageGCHighThresholdPercent: 100
syncFrequency: 10s
KCFG
kubelet --config /etc/kubernetes/kubelet.yaml --kubeconfig /etc/kubernetes/kubeconfig \
  --root-dir /var/lib/kubelet --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
  --node-labels spindle.csi.dev/worker=true \
  >"$OUT/kubelet.log" 2>&1 &
kubelet_pid=$!
say "kubelet started ($(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN {printf "%.1f", b - a}') s after run.sh began)"
echo "$kubelet_pid" >/run/kubelet.pid

# sample_stalls: every 2 s, every task that has been in uninterruptible
# sleep (state D) for two samples running, with its kernel stack, into
# $STALLS with the UTC time. A volume's I/O pausing for seconds (a writer's
# gap, docs/testing.md) then shows where in the kernel it waited. Kernel
# threads and single-threaded programs are seen by their process; the
# records writers (Go: the fsync runs on any of their threads) thread by
# thread. A sample that comes over 5 s late is logged too: then the guest
# itself stalled, or the sampler with it. The file is on tmpfs (a pause of
# the 9p share must not stall the sampler too); the loop below copies it to
# out/ when it grew. Only with STALL_SAMPLER=1 (workers.sh's
# WORKER_STALL_SAMPLER): on a saturated guest one scan took 6-13 s of the
# CPU the tests need (docs/results/2026-11-29-testing-history.md, run O).
STALLS=/run/spindle-stalls.log
stalls_prev="" stalls_now=""
# note_stall STAT LINE: a task (its stat file and that file's line) in D now
# and at the previous sample is logged.
note_stall() {
  local state=${2##*) } task=${1%/stat}
  [ "${state:0:1}" = D ] || return 0
  stalls_now="$stalls_now $task"
  case " $stalls_prev " in
  *" $task "*)
    { echo "=== $(date -u +%H:%M:%S.%3N) $task ($(cat "$task/comm" 2>/dev/null)) in D"
      cat "$task/stack" 2>/dev/null; } >>"$STALLS" ;;
  esac
}
sample_stalls() {
  set +e
  local st line task last=$SECONDS
  while :; do
    [ $((SECONDS - last)) -le 5 ] ||
      echo "=== $(date -u +%H:%M:%S.%3N) the sampler ran $((SECONDS - last)) s after its previous sample" >>"$STALLS"
    last=$SECONDS
    stalls_now=""
    for st in /proc/[0-9]*/stat; do
      read -r line 2>/dev/null <"$st" || continue
      case $line in
      *"(spindle-e2e-pod) "*)
        for task in "${st%/stat}"/task/[0-9]*/stat; do
          read -r line 2>/dev/null <"$task" && note_stall "$task" "$line"
        done ;;
      *) note_stall "$st" "$line" ;;
      esac
    done
    stalls_prev=$stalls_now
    sleep 2
  done
}
[ "${STALL_SAMPLER:-0}" != 1 ] || sample_stalls </dev/null >/dev/null 2>&1 &
stalls_copied=0

# run_exec F: runs the host's command file F (workers.sh exec) and hands
# back its output and exit status, the status file last and whole (the host
# waits for it, then reads both).
run_exec() {
  local f=$1 base=${1%.sh} rc=0
  timeout 300 bash "$f" >"$base.out.tmp" 2>&1 </dev/null || rc=$?
  mv "$base.out.tmp" "$base.out" && rm -f "$f" &&
    echo "$rc" >"$base.rc.tmp" && mv "$base.rc.tmp" "$base.rc"
}

# Until the host asks to stop (or kills the guest).
mkdir -p "$SHARE/exec"
while [ ! -e "$SHARE/stop" ]; do
  if ! kill -0 "$kubelet_pid" 2>/dev/null; then
    say "kubelet exited"; tail -n 20 "$OUT/kubelet.log"; exit 1
  fi
  for f in "$SHARE"/exec/*.sh; do
    [ -e "$f" ] || continue
    # Not under set -e: a result that cannot be handed back (the share's
    # file gone, as once after a host-side caller gave up) once ended this
    # loop, and with it the worker and every volume on it.
    run_exec "$f" || say "exec $(basename "$f"): its result could not be handed back"
  done
  if [ "${STALL_SAMPLER:-0}" = 1 ]; then
    stalls_size=$(stat -c %s "$STALLS" 2>/dev/null || echo 0)
    if [ "$stalls_size" != "$stalls_copied" ]; then
      cp "$STALLS" "$OUT/stalls.log" && stalls_copied=$stalls_size
    fi
  fi
  sleep 1
done
say "stopping"
kill "$kubelet_pid" 2>/dev/null || true
wait "$kubelet_pid" 2>/dev/null || true
pkill containerd || true
sleep 1
umount /var/lib/kubelet /var/lib/containerd 2>/dev/null || true
exit 0
