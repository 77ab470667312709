#!/bin/bash
# Start or stop a tgtd for tests: listening on 127.0.0.1 only (TGT_ADDR picks
# another address, e.g. 192.168.77.1 in hack/vm/services.sh's network
# namespace), its control socket, pid file and log in DIR, with no targets
# (the tests make them).
#
#   hack/tgtd.sh start DIR [PORT]   (PORT defaults to 3260)
#   hack/tgtd.sh stop DIR
#
# tgtadm then needs TGT_IPC_SOCKET=DIR/tgtd.socket. stop ends only the tgtd
# whose pid DIR/tgtd.pid names, gracefully first (targets deleted, sessions
# cut), and is a no-op when none runs.
set -euo pipefail
op=${1:?usage: $0 start|stop DIR [PORT]}
D=${2:?usage: $0 start|stop DIR [PORT]}
PORT=${3:-3260}
TGT_ADDR=${TGT_ADDR:-127.0.0.1}
export TGT_IPC_SOCKET=$D/tgtd.socket
export PATH="$PATH:/usr/sbin:/sbin"

# alive: the process exists and is not a zombie.
alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat"; }

case $op in
start)
  command -v tgtd >/dev/null || { echo "tgtd is not installed (Debian package tgt)" >&2; exit 127; }
  if [ -s "$D/tgtd.pid" ] && alive "$(cat "$D/tgtd.pid")"; then
    echo "tgtd already runs in $D (pid $(cat "$D/tgtd.pid"))" >&2; exit 1
  fi
  mkdir -p "$D"
  rm -f "$D"/tgtd.socket* "$D/tgtd.pid"
  # setsid: the daemon must not get the terminal's or the test's signals.
  setsid tgtd -f --iscsi portal="$TGT_ADDR:$PORT" >"$D/tgtd.log" 2>&1 </dev/null &
  echo $! >"$D/tgtd.pid"
  for _ in $(seq 1 200); do
    tgtadm --mode sys --op show >/dev/null 2>&1 && break
    alive "$(cat "$D/tgtd.pid")" || break
    sleep 0.025
  done
  if ! tgtadm --mode sys --op show >/dev/null 2>&1; then
    echo "tgtd did not start:" >&2; cat "$D/tgtd.log" >&2
    P=$(cat "$D/tgtd.pid"); alive "$P" && kill -KILL "$P"
    rm -f "$D/tgtd.pid"; exit 1
  fi
  echo "tgtd pid $(cat "$D/tgtd.pid") on $TGT_ADDR:$PORT, control socket $TGT_IPC_SOCKET"
  ;;
stop)
  P=$(cat "$D/tgtd.pid" 2>/dev/null || true)
  if [ -n "$P" ] && alive "$P" && grep -qx tgtd "/proc/$P/comm"; then
    tgtadm --op update --mode sys --name State -v offline 2>/dev/null || true
    for tid in $(tgtadm --lld iscsi --op show --mode target 2>/dev/null | sed -n 's/^Target \([0-9]*\):.*/\1/p'); do
      tgtadm --lld iscsi --op delete --mode target --tid "$tid" --force || true
    done
    tgtadm --op delete --mode system 2>/dev/null || true
    for _ in $(seq 1 40); do alive "$P" || break; sleep 0.05; done
    if alive "$P"; then kill -TERM "$P"; sleep 0.5; fi
    if alive "$P"; then kill -KILL "$P"; fi
    echo "tgtd (pid $P) stopped"
  fi
  rm -f "$D/tgtd.pid" "$D"/tgtd.socket*
  ;;
*)
  echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac
