#!/usr/bin/env bash
# Installs every system package Spindle's tests, demo and benchmark need on a
# Debian machine. Idempotent and quick when everything is present: it only
# calls apt-get for what is missing. Used by `make test`, `make demo`,
# `make bench` and .ci/run alike, so a newcomer and CI set up the same way.
# `hack/install-deps.sh kind` installs only what `make e2e-kind` needs:
# Docker (Debian's docker.io, only where no dockerd is installed, set up by
# hack/kind/docker.sh so that it never touches the firewall), jq and capsh
# (its runc wrapper), mmdebstrap (the offline images), iptables and the
# tools the run checks the host with.
# `hack/install-deps.sh previous-release` installs what the previous
# release's own hack/images.sh copies into its driver image (`make
# e2e-multinode` assembles chart 0.1.0's image from that commit): this
# machine's Ceph CLIs, Debian 12's 16.2.15. Nothing of today's uses them:
# the project's Ceph CLIs run in a Ceph root (hack/ceph/run).
set -euo pipefail

# program -> Debian package that provides it
declare -A needs=(
  [losetup]=mount
  [blkid]=util-linux
  [mount]=mount
  [mkfs.ext4]=e2fsprogs
  [resize2fs]=e2fsprogs
  [e2fsck]=e2fsprogs
  [dumpe2fs]=e2fsprogs
  [debugfs]=e2fsprogs
  [mkfs.xfs]=xfsprogs
  [xfs_growfs]=xfsprogs
  [xfs_info]=xfsprogs
  [findmnt]=util-linux
  [mkfs.btrfs]=btrfs-progs
  [btrfs]=btrfs-progs
  [truncate]=coreutils
  [sha256sum]=coreutils
  [openssl]=openssl # the local cluster's certificates (make e2e)
  # iSCSI: the tgt target, libiscsi's client tools, and the userspace
  # initiator (qemu-storage-daemon; Debian 12 ships it in qemu-system-common)
  [tgtd]=tgt
  [tgtadm]=tgt
  [iscsi-ls]=libiscsi-bin
  [iscsi-inq]=libiscsi-bin
  [qemu-img]=qemu-utils
  [qemu-storage-daemon]=qemu-system-common
  [fusermount3]=fuse3
  # the rbd backend's tests and the driver image take Ceph (daemons, CLIs,
  # client libraries) from a Ceph root that hack/ceph/root.sh builds with
  # mmdebstrap (below): Debian 12's own Ceph 16 cannot log in to Ceph 20.
  # Building the driver needs librados and librbd headers (cgo, go-ceph).
  [unshare]=util-linux # hack/ceph/run
  [gcc]=gcc
  # the qemu guests of `make vmtest` (hack/vm/): qemu itself, mmdebstrap for
  # the guest's root filesystem and the Ceph roots, xz to unpack the
  # kernel to a PVH vmlinux.
  # (qemu-img is above.) The host has no cpio; hack/vm/build.sh uses the
  # guest's static busybox and chroot depmod instead.
  [qemu-system-x86_64]=qemu-system-x86
  [mmdebstrap]=mmdebstrap
  [xz]=xz-utils
  [ip]=iproute2 # the guests' network namespace and tap
  [socat]=socat # the host-side controllers' gRPC, reached by the guests over TCP
  # `make bench`'s data path: fio on published volumes and on what backs
  # them (Debian's fio has the rbd engine)
  [fio]=fio
  # the driver image's kernel attach tools (hack/images.sh copies them from
  # here, as the Dockerfile installs them): the iSCSI kernel initiator's
  # iscsiadm, rbd-nbd, and modprobe, with which the node plugin loads
  # iscsi_tcp, rbd or nbd (this machine's own kernel has none of them)
  [iscsiadm]=open-iscsi
  [modprobe]=kmod
  # encrypted volumes: cryptsetup (LUKS2 headers; the node tests run it on
  # a file) and dmsetup (whether the kernel has dm-crypt)
  [cryptsetup]=cryptsetup-bin
  [dmsetup]=dmsetup
)

case ${1:-} in
kind)
  needs=([losetup]=mount [findmnt]=util-linux [sysctl]=procps [git]=git [jq]=jq [capsh]=libcap2-bin
    [iptables]=iptables [mmdebstrap]=mmdebstrap [ip]=iproute2)
  ;;
previous-release)
  needs=([rbd]=ceph-common [ceph]=ceph-common [rados]=ceph-common [rbd-nbd]=rbd-nbd [rbd-fuse]=rbd-fuse)
  ;;
esac

# file -> Debian package, for what is not a program on PATH
declare -A files=(
  # the driver's Ceph client (internal/ceph, cgo over librados and librbd)
  [/usr/include/rbd/librbd.h]=librbd-dev
  [/usr/include/rados/librados.h]=librados-dev
  # qemu's iSCSI block driver (libiscsi), a loadable module
  [/usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so]=qemu-block-extra
  # the database of `make e2e-multinode` (hack/images.sh postgres copies
  # the server, initdb, psql and pgbench into an image)
  [/usr/lib/postgresql/15/bin/postgres]=postgresql-15
  [/usr/lib/postgresql/15/bin/pgbench]=postgresql-15
  [/usr/lib/postgresql/15/bin/psql]=postgresql-client-15
)

missing=()
for prog in "${!needs[@]}"; do
  if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$prog" >/dev/null 2>&1; then
    missing+=("${needs[$prog]}")
  fi
done

[ -z "${1:-}" ] || files=()
for file in "${!files[@]}"; do
  # An architecture's library path only where it exists (amd64 here).
  case $file in /usr/lib/x86_64-linux-gnu/*) [ -d /usr/lib/x86_64-linux-gnu ] || continue ;; esac
  if [ ! -e "$file" ]; then
    missing+=("${files[$file]}")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  # unique package names
  mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [ "$(id -u)" -ne 0 ]; then
    echo "hack/install-deps.sh: missing packages ${pkgs[*]}; run as root (or: sudo apt-get install ${pkgs[*]})" >&2
    exit 1
  fi
  echo "hack/install-deps.sh: installing ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  echo "hack/install-deps.sh: done"
fi
if [ "${1:-}" = kind ]; then
  "$(dirname "$0")/kind/docker.sh" install
fi
