#!/usr/bin/env bash
# Stops the cluster hack/ceph-up.sh started in DIR: it kills only the PIDs in
# DIR's pid files, and only if they are still ceph daemons. SIGKILL, since the
# data is throw-away (memstore); PURGE=1 also deletes DIR.
#
#   hack/ceph-down.sh DIR
set -uo pipefail
D=${1:?usage: $0 DIR}
n=0
alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; } # a zombie is dead
for name in osd.0 mgr.x mon.a; do
  f=$D/run/$name.pid
  [ -s "$f" ] || continue
  p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null && grep -q '^ceph-' "/proc/$p/comm"; then
    kill -KILL "$p"; n=$((n+1))
    for _ in $(seq 1 100); do alive "$p" || break; sleep 0.05; done
  fi
  rm -f "$f"
done
[ "${PURGE:-0}" = 1 ] && rm -rf "$D"
echo "ceph-down.sh: stopped $n daemon(s) in $D"
