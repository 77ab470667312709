#!/usr/bin/env bash
# Worker nodes for the local cluster, each a qemu guest (hack/vm's, Debian's
# own kernel, so krbd, rbd-nbd and the iSCSI kernel initiator work there)
# with containerd + runc and a real kubelet joined to the control plane on
# this machine (hack/local-cluster/up.sh must be running).
#
#   workers.sh up [N]       boot N workers (default $WORKERS, 2) and wait until
#                           each node is Ready; prints boot and join times
#   workers.sh down         stop every worker cleanly (kubelet, containerd,
#                           power off), delete their Node objects, remove the
#                           network's link to this machine
#   workers.sh stop NAME    stop one cleanly;   workers.sh start NAME  boot it again
#   workers.sh kill NAME    cut its power (qemu killed, no shutdown): a lost node
#   workers.sh isolate NAME cut it off from the API server only: its kubelet
#                           cannot report, while its pods and its Ceph and
#                           iSCSI sessions go on (a node the cluster thinks lost)
#   workers.sh rejoin NAME  give it back its API server connection
#   workers.sh status       each worker's state, qemu RSS and node condition
#   workers.sh exec NAME CMD...  run a shell command as root on a worker (for
#                           debugging; the tests look through the cluster)
#
# Worker i is spindle-worker-i: guest address 192.168.77.(2+i) on the
# guests' bridge (hack/vm/net.sh), pod subnet 10.244.i.0/24 (this machine's
# own node has 10.244.0.0/24). Its disk ($CLUSTER_DIR/workers/NAME/disk.img,
# sparse) keeps containerd's images and kubelet's root across boots.
#
# The network (hack/vm/net.sh uplink): a veth pair links this machine
# (192.168.76.1) to the guests' namespace, which routes between it and the
# guests; this machine routes 192.168.77.0/24 and the workers' pod subnets
# there, so the apiserver reaches the kubelets (logs, exec, pod proxy). The
# apiserver listens on 127.0.0.1 only; socat forwards 192.168.76.1:6443 to it,
# and its certificate names that address (up.sh). Nothing else is reachable
# from the guests: the namespace has no default route.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/local-cluster/env.sh
. "$HERE/env.sh"
# shellcheck source=hack/vm/lib.sh
. "$REPO/hack/vm/lib.sh"

WORKERS=${WORKERS:-2}
WORKER_MEM=${WORKER_MEM:-1536}
WORKER_SMP=${WORKER_SMP:-2}
WORKER_DISK=${WORKER_DISK:-8G}
# WORKER_STALL_SAMPLER=1: each worker logs its tasks blocked in D, with
# their kernel stacks, to out/stalls.log (worker-guest.sh); off by default,
# it takes a loaded guest's CPU.
# WORKER_SYSTEM_CPU_WEIGHT: the CPU weight of each worker's system.slice
# (containerd, runc, kubelet) against kubepods.slice's 79 (worker-guest.sh
# says why; default 200).
# WORKER_SHARED_DIRS: directories of this machine every worker mounts at the
# same path (9p), as shared storage would be, e.g. a loop pool (an iSCSI
# node needs no share of its pool: it reaches the target's portal).
WORKER_SHARED_DIRS=${WORKER_SHARED_DIRS:-}
JOIN_TIMEOUT=${JOIN_TIMEOUT:-600}
W=$CLUSTER_DIR/workers
P=$CLUSTER_DIR/pki
FORWARDER_PID=$RUN/apiserver-forwarder.pid

worker_name() { echo "spindle-worker-$1"; }
worker_index() { echo "${1##*-}"; }
worker_ip() { echo "192.168.77.$((2 + $1))"; }
worker_subnet() { echo "10.244.$1.0/24"; }
# runner_pid NAME: hack/vm/run.sh's PID for the worker (empty if none).
runner_pid() {
  local f=$W/$1/run.pid p
  [ -s "$f" ] || return 0
  p=$(cat "$f")
  if alive "$p"; then echo "$p"; fi
}
# qemu_pid NAME: the worker's qemu process (not timeout or ip netns exec).
qemu_pid() {
  local p
  for p in $(pgrep -f "qemu-system-x86_64.*path=$W/$1/share,"); do
    if grep -q '^qemu-system' "/proc/$p/comm" 2>/dev/null; then echo "$p"; return; fi
  done
}
node_ready() { [ "$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
# ready_since NAME EPOCH: the node is Ready by a heartbeat after EPOCH (its
# kubelet of this boot, not the last one's status).
ready_since() {
  local hb
  node_ready "$1" || return 1
  hb=$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null)
  [ -n "$hb" ] && [ "$(date -d "$hb" +%s)" -ge "${2%.*}" ]
}

# The link between this machine and the guests' network, and the forwarder.
network_up() {
  "$REPO/hack/vm/net.sh" up >/dev/null
  "$REPO/hack/vm/net.sh" uplink >/dev/null
  if [ ! -s "$FORWARDER_PID" ] || ! alive "$(cat "$FORWARDER_PID")"; then
    socat "TCP-LISTEN:6443,bind=$VM_UPLINK_HOST_IP,reuseaddr,fork" TCP:127.0.0.1:6443 \
      >"$LOGS/apiserver-forwarder.log" 2>&1 &
    echo $! >"$FORWARDER_PID"
  fi
}

# shared_specs: WORKER_SHARED_DIRS as run.sh's VM_EXTRA_SHARES (TAG=DIR).
shared_specs() {
  local k=0 dir specs=()
  for dir in $WORKER_SHARED_DIRS; do specs+=("shared$k=$dir"); k=$((k + 1)); done
  echo "${specs[*]}"
}

# prepare I: the worker's certificates, share and disk (kept if present).
prepare() {
  local i=$1 name ip d s
  name=$(worker_name "$i") ip=$(worker_ip "$i") d=$W/$(worker_name "$i")
  s=$d/share
  mkdir -p "$s/bin" "$s/cni" "$s/pki" "$s/images" "$s/out"
  rm -f "$s/stop"
  cp "$HERE/worker-guest.sh" "$s/run.sh"
  chmod +x "$s/run.sh"
  # Hard links when the caches are on the same filesystem (no copy).
  link() { ln -f "$1" "$2" 2>/dev/null || cp -f "$1" "$2"; }
  link "$BIN/kubelet" "$s/bin/kubelet"
  for b in containerd containerd-shim-runc-v2 ctr; do link "$DEBS/usr/bin/$b" "$s/bin/$b"; done
  link "$DEBS/usr/sbin/runc" "$s/bin/runc"
  for b in bridge host-local loopback; do link "$DEBS/usr/lib/cni/$b" "$s/cni/$b"; done
  rm -f "$s"/images/*.tar
  for img in "$CLUSTER_DIR"/images/*.tar; do
    [ -e "$img" ] && link "$img" "$s/images/$(basename "$img")"
  done
  if [ ! -s "$s/pki/node-client.crt" ]; then
    (
      cd "$s/pki"
      cp "$P/ca.crt" .
      openssl req -newkey rsa:2048 -nodes -keyout node-client.key -out node-client.csr \
        -subj "/O=system:nodes/CN=system:node:$name" 2>/dev/null
      openssl x509 -req -in node-client.csr -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial \
        -out node-client.crt -days 30 -extfile <(echo extendedKeyUsage=clientAuth) 2>/dev/null
      openssl req -newkey rsa:2048 -nodes -keyout node-serving.key -out node-serving.csr -subj "/CN=$name" 2>/dev/null
      openssl x509 -req -in node-serving.csr -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial \
        -out node-serving.crt -days 30 \
        -extfile <(printf 'subjectAltName=IP:%s,DNS:%s\nextendedKeyUsage=serverAuth' "$ip" "$name") 2>/dev/null
      rm -f ./*.csr
    )
  fi
  cat >"$s/node.env" <<ENV
NODE_NAME=$name
NODE_IP=$ip
GATEWAY=$VM_HOST_IP
POD_SUBNET=$(worker_subnet "$i")
APISERVER=https://$VM_UPLINK_HOST_IP:6443
SHARED_DIRS="$(shared_specs)"
STALL_SAMPLER=${WORKER_STALL_SAMPLER:-0}
SYSTEM_CPU_WEIGHT=${WORKER_SYSTEM_CPU_WEIGHT:-200}
ENV
  [ -e "$d/disk.img" ] || truncate -s "$WORKER_DISK" "$d/disk.img"
  # Routes: this machine -> the worker's pods via the namespace, the
  # namespace -> the worker.
  ip route replace "$(worker_subnet "$i")" via "$VM_UPLINK_NS_IP"
  in_netns ip route replace "$(worker_subnet "$i")" via "$ip"
}

# boot I: starts the worker's guest in the background.
boot() {
  local i=$1 name d
  name=$(worker_name "$i") d=$W/$(worker_name "$i")
  [ -z "$(runner_pid "$name")" ] || { echo "workers: $name is already running"; return 0; }
  rm -f "$d/share/stop"
  date +%s.%N >"$d/boot.started"
  VM_ID=$i VM_DISK=$d/disk.img VM_EXTRA_SHARES="$(shared_specs)" MEM=$WORKER_MEM SMP=$WORKER_SMP TIMEOUT=${WORKER_TIMEOUT:-86400} \
    setsid "$REPO/hack/vm/run.sh" "$d/share" >"$LOGS/worker-$name.log" 2>&1 </dev/null &
  echo $! >"$d/run.pid"
}

# wait_ready NAME: until the node is Ready; prints boot and join times.
wait_ready() {
  local name=$1 d=$W/$1 t0 boot_s
  t0=$(cat "$d/boot.started")
  for ((k = 0; k < JOIN_TIMEOUT * 2; k++)); do
    ready_since "$name" "$t0" && break
    [ -n "$(runner_pid "$name")" ] || { echo "workers: $name's guest exited; see $LOGS/worker-$name.log" >&2; return 1; }
    sleep 0.5
  done
  ready_since "$name" "$t0" || { echo "workers: $name not Ready after ${JOIN_TIMEOUT}s; see $d/share/out/" >&2; return 1; }
  # console.log's lines: "[  16.664] SPINDLE-VM-START ...", time since qemu started.
  boot_s=$(sed -n 's/^\[ *\([0-9.]*\)\] SPINDLE-VM-START.*/\1/p' "$d/share/out/console.log" 2>/dev/null | head -1)
  echo "workers: $name Ready $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s after qemu started (boot to the first guest command ${boot_s:-?} s)"
}

# stop NAME: a clean stop; the guest powers off when its run.sh ends.
stop() {
  local name=$1 p
  p=$(runner_pid "$name")
  [ -n "$p" ] || return 0
  touch "$W/$name/share/stop"
  for _ in $(seq 1 120); do alive "$p" || break; sleep 0.5; done
  if alive "$p"; then
    echo "workers: $name did not power off in 60 s; killing it" >&2
    kill -TERM "$p" 2>/dev/null || true
  fi
}

case ${1:-} in
up)
  n=${2:-$WORKERS}
  [ "$(id -u)" = 0 ] || die "needs root"
  kubectl get --raw /readyz >/dev/null 2>&1 || die "the local cluster is not running (hack/local-cluster/up.sh)"
  [ -s "$GUEST_DIR/rootfs.img" ] || "$REPO/hack/vm/build.sh"
  network_up
  # Recorded for `start`: a worker booted again mounts the same ones.
  mkdir -p "$W"
  echo "$WORKER_SHARED_DIRS" >"$W/shared-dirs"
  booted=()
  for ((i = 1; i <= n; i++)); do
    if [ -n "$(runner_pid "$(worker_name "$i")")" ]; then continue; fi
    prepare "$i"
    boot "$i"
    booted+=("$(worker_name "$i")")
  done
  # Each in the background, so that each one's time is its own.
  pids=()
  for name in "${booted[@]}"; do wait_ready "$name" & pids+=($!); done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  exit $rc
  ;;
start)
  name=${2:?usage: $0 start NAME}
  [ -n "$WORKER_SHARED_DIRS" ] || WORKER_SHARED_DIRS=$(cat "$W/shared-dirs" 2>/dev/null || true)
  network_up
  prepare "$(worker_index "$name")"
  boot "$(worker_index "$name")"
  wait_ready "$name"
  ;;
stop) stop "${2:?usage: $0 stop NAME}" ;;
kill)
  name=${2:?usage: $0 kill NAME}
  q=$(qemu_pid "$name")
  [ -n "$q" ] || die "$name has no running guest"
  kill -KILL "$q"
  echo "workers: $name's power cut (qemu $q killed)"
  ;;
isolate | rejoin)
  name=${2:?usage: $0 $1 NAME}
  # A policy rule in the guests' namespace refuses to route the worker's
  # packets to the API server's forwarder; nothing else changes.
  rule=(from "$(worker_ip "$(worker_index "$name")")" to "$VM_UPLINK_HOST_IP" ipproto tcp dport 6443 prohibit)
  if [ "$1" = isolate ]; then
    in_netns ip rule add "${rule[@]}"
    echo "workers: $name cut off from the API server"
  else
    while in_netns ip rule del "${rule[@]}" 2>/dev/null; do :; done
    echo "workers: $name reaches the API server again"
  fi
  ;;
exec)
  name=${2:?usage: $0 exec NAME CMD...}
  shift 2
  [ -n "$(runner_pid "$name")" ] || die "$name is not running"
  x=$W/$name/share/exec/$$-$RANDOM
  mkdir -p "$(dirname "$x")"
  printf '%s\n' "$*" >"$x.sh.tmp" && mv "$x.sh.tmp" "$x.sh"
  for _ in $(seq 1 620); do [ -e "$x.rc" ] && break; sleep 0.5; done
  [ -e "$x.rc" ] || die "$name did not run the command in 310 s (left for it: $x.sh)"
  cat "$x.out"
  rc=$(cat "$x.rc")
  rm -f "$x.out" "$x.rc"
  exit "$rc"
  ;;
status)
  for d in "$W"/*/; do
    [ -d "$d" ] || continue
    name=$(basename "$d") q=$(qemu_pid "$name")
    rss=$([ -n "$q" ] && awk '/^VmRSS:/ {printf "%d MiB", $2 / 1024}' "/proc/$q/status" || echo -)
    ready=$(kubectl get node "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
    echo "$name running=$([ -n "$q" ] && echo yes || echo no) rss=$rss ready=${ready:-none}"
  done
  ;;
down)
  [ -d "$W" ] || exit 0
  for d in "$W"/*/; do [ -d "$d" ] && stop "$(basename "$d")"; done
  for d in "$W"/*/; do
    [ -d "$d" ] || continue
    kubectl delete node "$(basename "$d")" --wait=false >/dev/null 2>&1 || true
  done
  if [ -s "$FORWARDER_PID" ]; then kill "$(cat "$FORWARDER_PID")" 2>/dev/null || true; rm -f "$FORWARDER_PID"; fi
  "$REPO/hack/vm/net.sh" uplink-down >/dev/null
  echo "workers: down"
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
  ;;
esac
