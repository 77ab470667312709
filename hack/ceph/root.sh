#!/usr/bin/env bash
# Builds (once) and prints the directory of a Ceph root: a Debian root
# filesystem made by mmdebstrap with one Ceph release's daemons, CLIs and
# libraries, and every tool the driver image carries (hack/images.sh
# assembles the image from it). This machine's own Debian (bookworm) has
# Ceph 16 only, which cannot log in to Tentacle's default (aes256k) keys;
# the roots bring the releases Rook supports:
#
#   20  Tentacle, Debian sid's packages (the default; >= 20.2.4)
#   18  Reef, Debian trixie's packages (the oldest release Spindle accepts)
#
#   hack/ceph/root.sh [RELEASE]      prints e.g. ~/.cache/spindle/ceph/20/root
#
# Programs run in a root through hack/ceph/run. The root is rebuilt only
# when a pin changes (suite, mirror, package list, this script); it is
# built under a temporary name and renamed when complete, under a lock, so
# test packages that ask at the same time build it once. About 2-4 minutes
# and 1 GB for release 20.
set -euo pipefail
release=${1:-${SPINDLE_CEPH_RELEASE:-20}}
CACHE=${SPINDLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spindle}
export PATH="$PATH:/usr/sbin:/sbin"

case $release in
  20) suite=sid; want='^20\.2\.([4-9]|[1-9][0-9])' ;;
  18) suite=trixie; want='^18\.2\.' ;;
  *) echo "ceph/root.sh: release $release is not one of 20 (tentacle), 18 (reef)" >&2; exit 2 ;;
esac

# The Ceph cluster (hack/ceph-up.sh) and its clients: daemons, the rbd and
# ceph CLIs, rbd-nbd and qemu-storage-daemon with its rbd and iscsi
# drivers (the userspace attach paths), and the tools the driver runs on a
# node (filesystems, loop devices, iSCSI, LUKS, modules), so that the
# driver image can be assembled from one consistent root.
packages=(ceph-mon ceph-osd ceph-mgr ceph-common rbd-nbd
  uuid-runtime procps iproute2 mount util-linux e2fsprogs xfsprogs btrfs-progs fuse3
  qemu-utils qemu-block-extra kmod open-iscsi tgt cryptsetup-bin dmsetup ca-certificates)
# Release 18's root serves the cluster-version tests (make test-ceph): its
# daemons and its own client. Fewer tools.
if [ "$release" = 18 ]; then
  packages=(ceph-mon ceph-osd ceph-mgr ceph-common uuid-runtime procps iproute2 mount util-linux)
fi

# The first Debian mirror this machine's apt names (deb822 URIs: or a
# one-line deb entry), else Debian's own.
mirror=$(sed -n -E 's/^URIs:[[:space:]]*([^[:space:]]+).*/\1/p; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]*debian\/?)[[:space:]]+.*/\2/p' \
  /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
  grep -E '/debian/?$' | head -1 || true)
mirror=${mirror:-http://deb.debian.org/debian}

dir=$CACHE/ceph/$release
root=$dir/root
stamp="suite=$suite mirror=$mirror packages=${packages[*]} script=$(sha256sum "$0" | cut -c1-16)"
mkdir -p "$dir"
exec 9>"$dir/lock"
flock 9
if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$stamp" ] && [ -x "$root/usr/bin/ceph-mon" ]; then
  echo "$root"
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "ceph/root.sh: mmdebstrap is not installed (hack/install-deps.sh installs it)" >&2; exit 3; }
[ "$(id -u)" = 0 ] || { echo "ceph/root.sh: building the Ceph $release root needs root" >&2; exit 3; }
echo "ceph/root.sh: building the Ceph $release root from Debian $suite ($mirror) into $root" >&2
t0=$(date +%s)
rm -rf "$dir/new" "$dir/old"
# Check-Valid-Until off: sid's Release files of a mirror snapshot expire.
if ! mmdebstrap --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' \
  --include="$(IFS=,; echo "${packages[*]}")" "$suite" "$dir/new" "$mirror" >"$dir/build.log" 2>&1; then
  tail -20 "$dir/build.log" >&2
  echo "ceph/root.sh: mmdebstrap failed (whole log: $dir/build.log)" >&2
  rm -rf "$dir/new"
  exit 1
fi
version=$(chroot "$dir/new" ceph --version | awk '{print $3}')
if ! [[ $version =~ $want ]]; then
  echo "ceph/root.sh: Debian $suite gave Ceph $version, not release $release as pinned ($want)" >&2
  rm -rf "$dir/new"
  exit 1
fi
# Marks the root (hack/ceph/run and hack/ceph-up.sh look for it), and the
# mount points hack/ceph/run binds.
echo "$release $version" >"$dir/new/etc/spindle-ceph-root"
[ ! -d "$root" ] || mv "$root" "$dir/old"
mv "$dir/new" "$root"
rm -rf "$dir/old"
echo "$stamp" >"$dir/stamp"
echo "ceph/root.sh: Ceph $version root ready in $(( $(date +%s) - t0 )) s ($(du -sh "$root" | cut -f1))" >&2
echo "$root"
