#!/usr/bin/env bash
# Docker for `make e2e-kind`, on a machine that may have none, without ever
# touching the machine's firewall or forwarding.
#
#   hack/kind/docker.sh install   Debian's docker.io, when no dockerd is
#                                 installed; no service starts
#   hack/kind/docker.sh start     a dockerd of our own, when no Docker
#                                 daemon answers (else nothing)
#   hack/kind/docker.sh stop      stops the dockerd `start` started, and
#                                 removes the bridges it made
#
# Where a Docker daemon already runs (a laptop, GitHub Actions), start and
# stop do nothing: that Docker is used as it is.
#
# The dockerd started here reads its own configuration ($STATE/daemon.json,
# not /etc/docker): iptables, ip6tables, ip-masq and ip-forward off (Docker
# would otherwise set the FORWARD policy to DROP and turn forwarding on for
# the whole machine, which breaks the other bridges on it); its bridge and
# address pools away from the local cluster's and the qemu guests' subnets;
# its data in $STATE/docker-root. Containers then reach each other and this
# machine, nothing beyond it, which kind does not need. `install` writes
# the same settings to /etc/docker/daemon.json first, if there is none, so
# that a packaged service which does start is as harmless.
#
# Where root lacks a capability of the kernel's full set (this Firecracker
# VM has no CAP_SYS_RESOURCE in its bounding set), Docker's --privileged
# containers (every kind node) cannot start: `runc create failed: unable to
# start container process: unable to apply caps: operation not permitted`.
# The default runtime is then hack/kind/runc-bounding-caps, which leaves out
# the capabilities root does not have.
#
# Env: STATE (/var/tmp/spindle-kind), DOCKER_BIP (172.29.0.1/24),
# DOCKER_POOL (172.30.0.0/16).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${STATE:-/var/tmp/spindle-kind}
PIDFILE=$STATE/dockerd.pid
export PATH="$PATH:/usr/sbin:/sbin"

# daemon_json [RUNTIME]: the firewall-neutral settings, with RUNTIME as the
# default runtime when given.
daemon_json() {
  local runtime=
  if [ -n "${1:-}" ]; then
    runtime=$(printf ',\n  "runtimes": {"runc-bounding-caps": {"path": "%s"}},\n  "default-runtime": "runc-bounding-caps"' "$1")
  fi
  cat <<EOF
{
  "iptables": false,
  "ip6tables": false,
  "ip-masq": false,
  "ip-forward": false,
  "bip": "${DOCKER_BIP:-172.29.0.1/24}",
  "default-address-pools": [{"base": "${DOCKER_POOL:-172.30.0.0/16}", "size": 24}],
  "data-root": "$STATE/docker-root",
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m", "max-file": "2"}$runtime
}
EOF
}

# missing_caps: true when root's bounding set lacks a capability the kernel
# knows (Docker grants --privileged containers all of them).
missing_caps() {
  local bnd last
  bnd=$(awk '/^CapBnd/{print $2}' /proc/self/status)
  last=$(cat /proc/sys/kernel/cap_last_cap)
  [ $((0x$bnd)) -ne $(((1 << (last + 1)) - 1)) ]
}

install_docker() {
  if command -v dockerd >/dev/null; then
    return 0
  fi
  if [ ! -e /etc/docker/daemon.json ]; then
    mkdir -p /etc/docker
    daemon_json >/etc/docker/daemon.json
  fi
  # No service may start during the install (policy-rc.d, as in a container).
  local policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy=1
  fi
  echo "docker: installing docker.io" >&2
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends docker.io >/dev/null
  [ -z "$policy" ] || rm -f /usr/sbin/policy-rc.d
}

start_docker() {
  if docker info >/dev/null 2>&1; then
    echo "docker: using the Docker daemon that runs already" >&2
    return 0
  fi
  command -v dockerd >/dev/null || { echo "docker: no dockerd; run hack/kind/docker.sh install (hack/install-deps.sh kind)" >&2; exit 1; }
  mkdir -p "$STATE/docker-root"
  local runtime=
  if missing_caps; then
    runtime=$STATE/runc-bounding-caps
    install -m 0755 "$HERE/runc-bounding-caps" "$runtime"
  fi
  daemon_json "$runtime" >"$STATE/daemon.json"
  ip -o link show type bridge | awk -F': ' '{print $2}' >"$STATE/bridges.before"
  netns_mounts >"$STATE/netns.before"
  setsid dockerd --config-file "$STATE/daemon.json" >>"$STATE/dockerd.log" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { echo "docker: dockerd exited; see $STATE/dockerd.log" >&2; tail -n 5 "$STATE/dockerd.log" >&2; exit 1; }
    sleep 1
  done
  docker info --format 'docker: started Docker {{.ServerVersion}} ({{.Driver}}, cgroup v{{.CgroupVersion}}, default runtime {{.DefaultRuntime}})' >&2
}

stop_docker() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid=$(cat "$PIDFILE")
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
    kill -TERM "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    echo "docker: stopped dockerd $pid" >&2
  fi
  rm -f "$PIDFILE"
  # dockerd leaves its bridges (docker0, one per network) behind when it
  # stops; those that were not there before it started go.
  local br
  for br in $(ip -o link show type bridge | awk -F': ' '{print $2}'); do
    case $br in docker0 | br-*) grep -qx "$br" "$STATE/bridges.before" 2>/dev/null || ip link del "$br" ;; esac
  done
  rm -f "$STATE/bridges.before"
  # And the network namespaces it bind-mounts under /run/docker/netns
  # (the "default" one stayed mounted after a kind run here).
  local m
  for m in $(netns_mounts); do
    grep -qx "$m" "$STATE/netns.before" 2>/dev/null || umount "$m"
  done
  rm -f "$STATE/netns.before"
}

# netns_mounts: the mounts below /run/docker/netns, one per line.
netns_mounts() { findmnt -rn -o TARGET | grep '^/run/docker/netns/' || true; }

mkdir -p "$STATE"
case ${1:-} in
install) install_docker ;;
start) start_docker ;;
stop) stop_docker ;;
*) echo "usage: hack/kind/docker.sh install|start|stop" >&2; exit 2 ;;
esac
