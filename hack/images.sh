#!/usr/bin/env bash
# Assembles Spindle's container images without a container engine or a
# registry, as docker-archive tarballs that `ctr -n k8s.io images import`
# (and `kind load image-archive`) read:
#
#   spindle.tar           local.test/spindle:$TAG — the driver binary (with its
#                         Ceph client, librados and librbd) and the
#                         filesystem and attach tools with their shared
#                         libraries, all taken from the Ceph 20 root
#                         (hack/ceph/root.sh: Debian sid's packages, what the
#                         Dockerfile installs for users with Docker), so the
#                         image's Ceph client logs in to Tentacle's default
#                         (aes256k) keys
#   csi-provisioner.tar   local.test/csi-provisioner:v6.3.0, and likewise
#   csi-attacher.tar      csi-attacher, csi-resizer, csi-snapshotter and
#   ...                   snapshot-controller, from the binaries that
#                         hack/local-cluster/build.sh puts in $CACHE/bin
#
#   busybox-*.tar         registry.k8s.io/e2e-test-images/busybox:1.37.0-1 (and
#                         the other tags the suite names), glibc-dns-testing and
#                         nginx: Debian's busybox-static with every applet (the
#                         storage tests run only shell commands in them)
#   postgres.tar          local.test/postgres:15: Debian's PostgreSQL server,
#                         initdb, psql and pgbench, run as user postgres
#                         (999); its entrypoint spindle-postgres initialises
#                         $PGDATA once and runs the server (make e2e-multinode)
#   agnhost.tar           registry.k8s.io/e2e-test-images/agnhost:2.63.0:
#                         agnhost built from k8s.io/kubernetes, with busybox
#                         (hack/images.sh e2e; the names and tags the
#                         Kubernetes e2e suite asks for, `e2e.test --list-images`)
#
#   hack/images.sh [driver|sidecars|e2e|postgres|all]   (default all: driver and sidecars)
#
# IMAGES_DIR (default build/images) receives the tarballs; TAG (default dev)
# tags the driver image; PG_MAJOR (default 15) picks the PostgreSQL. The
# sidecar tags are build.sh's pinned versions.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spindle/local-cluster}
OUT=${IMAGES_DIR:-$REPO/build/images}
TAG=${TAG:-dev}
PG_MAJOR=${PG_MAJOR:-15}
VERSION=${VERSION:-$(git -C "$REPO" describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)}
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
what=${1:-all}
mkdir -p "$OUT"
imagetar() { (cd "$REPO" && go run ./hack/imagetar "$@"); }

# The programs the driver runs (internal/node, internal/backend/loop,
# k8s.io/mount-utils), with what they need at run time; and the attach
# paths' tools (iscsiadm, rbd for krbd, rbd-nbd, qemu-storage-daemon for the
# rbd-fuse mounter and the iSCSI userspace attacher, modprobe for their
# modules) and the controller's tgtadm (an iSCSI backend on tgt),
# cryptsetup and dmsetup for encrypted volumes, as the Dockerfile installs
# them. The driver calls Ceph itself (librados, librbd: the binary's own
# libraries), so the image carries no ceph or rados CLI, and no Python.
PROGRAMS=(losetup blkid wipefs mount umount findmnt mountpoint lsblk blockdev
  mkfs mkfs.ext4 mke2fs resize2fs e2fsck fsck fsck.ext4 dumpe2fs tune2fs
  mkfs.xfs xfs_growfs xfs_info xfs_spaceman xfs_db xfs_repair
  mkfs.btrfs btrfs stat sync sh date
  iscsiadm rbd rbd-nbd modprobe tgtadm cryptsetup dmsetup qemu-storage-daemon)
# qemu-storage-daemon loads its iSCSI and RBD drivers as modules, which
# link libiscsi and librbd.
QEMU_MODULES=(/usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so /usr/lib/x86_64-linux-gnu/qemu/block-rbd.so)
FILES=(/etc/mke2fs.conf)

driver() {
  echo "images: local.test/spindle:$TAG (from the Ceph root $("$REPO/hack/ceph/root.sh" 20))" >&2
  local tags
  tags=$("$REPO/hack/go-tags.sh")
  (cd "$REPO" && CGO_ENABLED=1 go build -tags "$tags" -trimpath -ldflags "-s -w -X main.version=$VERSION" -o "$OUT/spindle" ./cmd/spindle)
  (cd "$REPO" && CGO_ENABLED=0 go build -o "$OUT/imagetar" ./hack/imagetar)
  local args=(-tag "local.test/spindle:$TAG" -o "$OUT/spindle.tar"
    -merged-usr -binary "$OUT/spindle:/usr/local/bin/spindle" -entrypoint /usr/local/bin/spindle
    -dir /var/lib/spindle -dir /run/spindle -dir /etc/spindle
    -symlink /var/run:/run)
  # /var/run as Debian has it: rbd-nbd creates /var/run/ceph for its admin
  # socket at start and aborts without it.
  local p f m
  for p in "${PROGRAMS[@]}"; do args+=(-program "$p"); done
  for f in "${FILES[@]}"; do args+=(-file "$f"); done
  for m in "${QEMU_MODULES[@]}"; do args+=(-binary "$m:$m"); done
  # In the root: its programs and libraries, the binary linked against the
  # root's librados and librbd.
  "$REPO/hack/ceph/run" "$OUT/imagetar" "${args[@]}"
  rm -f "$OUT/spindle" "$OUT/imagetar"
}

# name version: the image of one sidecar binary from build.sh.
sidecar() {
  local name=$1 version=$2
  echo "images: local.test/$name:$version" >&2
  imagetar -tag "local.test/$name:$version" -o "$OUT/$name.tar" \
    -file "$CACHE/bin/$name:/$name" -entrypoint "/$name"
}

sidecars() {
  local missing=() b
  for b in csi-provisioner csi-attacher csi-resizer csi-snapshotter snapshot-controller; do
    [ -x "$CACHE/bin/$b" ] || missing+=("$b")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "images: ${missing[*]} not built in $CACHE/bin; run hack/local-cluster/build.sh first" >&2
    exit 1
  fi
  # The versions build.sh pins (its defaults, overridable the same way).
  sidecar csi-provisioner "${PROVISIONER:-v6.3.0}"
  sidecar csi-attacher "${ATTACHER:-v4.13.0}"
  sidecar csi-resizer "${RESIZER:-v2.3.0}"
  sidecar csi-snapshotter "${SNAPSHOTTER:-v8.7.0}"
  sidecar snapshot-controller "${SNAPSHOTTER:-v8.7.0}"
}

# The images the Kubernetes e2e suite's storage tests run, under the exact
# names it expects, from what build.sh put in the cache (E2E_SUITE=1).
e2e() {
  local bb=$CACHE/debs/root/bin/busybox
  [ -x "$bb" ] && [ -x "$CACHE/bin/agnhost" ] && [ -x "$CACHE/bin/e2e.test" ] || {
    echo "images: busybox, agnhost or e2e.test missing in $CACHE; run E2E_SUITE=1 hack/local-cluster/build.sh first" >&2
    exit 1
  }
  local list shell_images agnhost_tag
  list=$("$CACHE/bin/e2e.test" --list-images)
  # The images the storage tests run shell commands in (busybox, and the
  # glibc-dns-testing and nginx images whose commands they replace): one
  # busybox with every applet, under each name and tag.
  mapfile -t shell_images < <(grep -E '^registry.k8s.io/e2e-test-images/(busybox|glibc-dns-testing|nginx):' <<<"$list")
  agnhost_tag=$(grep '^registry.k8s.io/e2e-test-images/agnhost:' <<<"$list" | sort -V | tail -1)
  # Every applet but dd and sh: the suite writes with `dd oflag=nocache`,
  # which busybox's dd refuses, so the image carries this machine's GNU dd;
  # and busybox's sh runs its own applets before anything on PATH, so the
  # shell is bash (not dash: the suite's volumeIO init container counts
  # with `let`, which dash lacks, and loops for ever). Both with the
  # libraries they load.
  local applets=() a lib prog
  for a in $("$bb" --list); do
    case $a in busybox | dd | sh) ;; *) applets+=(-symlink "/bin/$a:/bin/busybox") ;; esac
  done
  applets+=(-file "$(command -v dd):/bin/dd" -file "$(readlink -f "$(command -v bash)"):/bin/sh")
  for lib in $(ldd "$(command -v dd)" "$(command -v bash)" | grep -o '^\s[^ ]*\( => [^ ]*\)\?' | grep -o '/[^ ]*$' | sort -u); do
    applets+=(-file "$(readlink -f "$lib"):$lib")
  done
  local t name
  for t in "${shell_images[@]}"; do
    name=${t#registry.k8s.io/e2e-test-images/}
    echo "images: $t" >&2
    imagetar -tag "$t" -o "$OUT/${name//[:\/]/-}.tar" -file "$bb:/bin/busybox" "${applets[@]}" -cmd sh
  done
  echo "images: $agnhost_tag" >&2
  imagetar -tag "$agnhost_tag" -o "$OUT/agnhost.tar" -file "$bb:/bin/busybox" "${applets[@]}" \
    -file "$CACHE/bin/agnhost:/agnhost" -symlink /agnhost-2:agnhost -dir /uploads -entrypoint /agnhost -cmd pause
}

# The database the multi-node tests run on an RBD volume: this machine's
# PostgreSQL (hack/install-deps.sh installs it), as a non-root server. The
# test database trusts every client; it holds nothing secret.
postgres() {
  local bin=/usr/lib/postgresql/$PG_MAJOR/bin share=/usr/share/postgresql/$PG_MAJOR
  [ -x "$bin/postgres" ] || { echo "images: $bin/postgres missing; run hack/install-deps.sh" >&2; exit 1; }
  echo "images: local.test/postgres:$PG_MAJOR" >&2
  local tmp
  tmp=$(mktemp -d)
  printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh\n' >"$tmp/passwd"
  printf 'root:x:0:\npostgres:x:999:\n' >"$tmp/group"
  cat >"$tmp/spindle-postgres" <<'SCRIPT'
#!/bin/sh
# Initialises $PGDATA once (a fresh volume), then runs the server in the
# foreground: every address, trust authentication, and the durability
# settings a database owner runs with (fsync, synchronous commit, full
# page writes), small enough for an emulated node.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  initdb --no-locale --encoding=UTF8 --auth=trust --username=postgres "$PGDATA"
  echo "host all all 0.0.0.0/0 trust" >>"$PGDATA/pg_hba.conf"
  # initdb synced what it wrote, not this line: without the sync a power
  # cut in the next half-minute loses it (make e2e-multinode's did).
  initdb --sync-only "$PGDATA"
fi
exec postgres -c listen_addresses='*' -c unix_socket_directories=/tmp \
  -c fsync=on -c synchronous_commit=on -c full_page_writes=on \
  -c shared_buffers=32MB -c max_connections=30 -c jit=off "$@"
SCRIPT
  chmod 755 "$tmp/spindle-postgres"
  local args=(-tag "local.test/postgres:$PG_MAJOR" -o "$OUT/postgres.tar" -merged-usr -user 999:999
    -file "$tmp/passwd:/etc/passwd" -file "$tmp/group:/etc/group"
    -file "$tmp/spindle-postgres:/usr/local/bin/spindle-postgres"
    -tree "$share" -file /usr/share/zoneinfo/Etc/UTC:/usr/share/zoneinfo/UTC
    -program sh -program sleep -program cat -program rm -program locale
    -dir /var/lib/postgresql -env TZ=UTC -env PGDATA=/var/lib/postgresql/data/pgdata
    -entrypoint /usr/local/bin/spindle-postgres)
  local p f
  for p in postgres initdb pg_isready psql pgbench; do
    args+=(-program "$bin/$p" -symlink "/usr/local/bin/$p:$bin/$p")
  done
  # The server's loadable modules (PL/pgSQL, snowball, encodings), not
  # the JIT's bitcode.
  for f in "/usr/lib/postgresql/$PG_MAJOR/lib"/*.so; do args+=(-file "$f"); done
  imagetar "${args[@]}"
  rm -rf "$tmp"
}

case $what in
driver) driver ;;
sidecars) sidecars ;;
e2e) e2e ;;
postgres) postgres ;;
all) sidecars && driver ;;
*) echo "usage: hack/images.sh [driver|sidecars|e2e|postgres|all]" >&2; exit 2 ;;
esac
echo "images: tarballs in $OUT; import with: ctr -n k8s.io images import $OUT/<name>.tar" >&2
