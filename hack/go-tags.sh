#!/usr/bin/env bash
# Prints the Go build tags that build Spindle with its Ceph client
# (internal/ceph over librados and librbd, through go-ceph) against this
# machine's librbd headers: "ceph", plus go-ceph's tag for a release
# older than the API go-ceph builds against by default (Squid's). Debian
# 12's librbd-dev is Pacific's: "ceph pacific". The functions Spindle
# needs of newer releases (clones by snapshot ID, group snapshot info) are
# looked up when called, so a binary built against old headers uses them
# where the library it runs with has them.
#
#   go build -tags "$(hack/go-tags.sh)" ./cmd/spindle
set -euo pipefail
h=${LIBRBD_HEADER:-/usr/include/rbd/librbd.h}
if [ ! -r "$h" ]; then
  echo "go-tags.sh: $h is missing: install librbd-dev and librados-dev (hack/install-deps.sh does)" >&2
  exit 1
fi
minor=$(awk '$2 == "LIBRBD_VER_MINOR" {print $3}' "$h")
case $minor in
  16) echo "ceph pacific" ;;
  17) echo "ceph quincy" ;;
  18) echo "ceph reef" ;;
  ''|[0-9]) echo "go-tags.sh: cannot read LIBRBD_VER_MINOR from $h" >&2; exit 1 ;;
  *) if [ "$minor" -lt 16 ]; then echo "go-tags.sh: $h is of librbd 1.$minor, older than Pacific's (1.16)" >&2; exit 1; fi
     echo ceph ;;
esac
