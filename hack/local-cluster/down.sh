#!/usr/bin/env bash
# Stops everything up.sh started and leaves nothing behind: no process, no
# mount, no loop device, no kubelet cgroup, the sysctls kubelet changed
# restored, and $CLUSTER_DIR removed (KEEP=1 keeps it, for reading logs).
set -uo pipefail
# shellcheck source=hack/local-cluster/env.sh
. "$(dirname "$0")/env.sh"
start=$SECONDS
# Worker nodes in qemu guests (workers.sh) first: their kubelets talk to
# the apiserver stopped below.
[ ! -d "$CLUSTER_DIR/workers" ] || "$(dirname "$0")/workers.sh" down >/dev/null
if [ -S "$CONTAINERD_SOCKET" ]; then
  for id in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks kill -s KILL "$id" >/dev/null 2>&1; done
fi
for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
  f=$RUN/${COMPONENTS[i]}.pid
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
  rm -f "$f"
done
# containerd-shim processes outlive containerd by design.
pkill -9 -f "containerd-shim.*$CLUSTER_DIR" 2>/dev/null
# Containers whose shim and containerd were killed first (a run killed
# mid-way) are orphans now, and may hold a volume's mount open; their
# pods' cgroups still list them.
find /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods -name cgroup.procs -exec cat {} + 2>/dev/null |
  sort -u | xargs -r kill -9 2>/dev/null
if [ -f "$RUN/sysctl.saved" ]; then
  while read -r setting; do sysctl -q -w "$setting"; done <"$RUN/sysctl.saved"
fi
ip link del "$POD_BRIDGE" 2>/dev/null
# The pods' network namespaces (the CNI bridge plugin's cni-<uuid>): a run
# killed before kubelet tore its sandboxes down leaves them behind, and no
# process is in them now that every container above is gone.
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ {print $1}'); do
  [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && ip netns del "$ns" 2>/dev/null
done
# Every loop device on a file of the cluster: the pool's images, and the
# pool's own filesystem image (POOL_FS). Once before the unmounts, while
# the images' paths still name the pool (a busy device detaches when its
# last user goes: autoclear), and once after, for the pool's own image.
detach_loops() {
  local dev
  for dev in $(losetup -n -O NAME,BACK-FILE 2>/dev/null | awk -v d="$CLUSTER_DIR/" 'index($2, d) == 1 {print $1}' | sort -r); do
    losetup -d "$dev" 2>/dev/null
  done
}
detach_loops
# Mounts, deepest first.
grep " $CLUSTER_DIR" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
detach_loops
# kubelet's cgroups (cgroupfs driver), every hierarchy.
for c in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
  [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
done
# kubelet creates this whatever --root-dir says.
rm -f /var/lib/kubelet/device-plugins/kubelet.sock
rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null
if [ "${KEEP:-0}" != 1 ]; then rm -rf "$CLUSTER_DIR"; fi
echo "down: stopped in $((SECONDS - start))s"
