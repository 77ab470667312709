#!/usr/bin/env bash
# hack/kind/host-state.sh: what of this machine a kind cluster's privileged
# nodes, or the dockerd hack/kind/docker.sh starts, could change, in a form
# to compare before and after `make e2e-kind`: the firewall (iptables -S,
# filter and nat), the sysctls (all but the counters that change by
# themselves, fs.quota's statistics among them, and the per-interface
# ones), the loop devices, the mount table (with propagation) and the
# bridges.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
echo "# iptables -S"
if command -v iptables >/dev/null; then
  iptables -S 2>&1
  iptables -t nat -S 2>&1
else
  echo "(no iptables)"
fi
echo "# sysctl"
sysctl -a 2>/dev/null |
  grep -vE '^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr)|kernel\.ns_last_pid|net\.netfilter\.nf_conntrack_count) |^(kernel\.random|fs\.quota)\.' |
  grep -vE '^net\.ipv[46]\.(conf|neigh)\.'
sysctl -a 2>/dev/null | grep -E '^net\.ipv[46]\.(conf|neigh)\.(all|default)\.'
echo "# losetup -a"
losetup -a | sort
echo "# mounts"
findmnt -rn -o TARGET,SOURCE,FSTYPE,OPTIONS,PROPAGATION | sort
echo "# bridges"
ip -o link show type bridge | awk -F': ' '{print $2}' | sort
