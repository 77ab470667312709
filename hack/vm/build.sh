#!/usr/bin/env bash
# Builds the qemu guest that `make vmtest` boots (hack/vm/run.sh), once, and
# caches it in $VM_CACHE/guest (default ~/.cache/spindle/vm/guest):
#
#   vmlinux         Debian's own kernel, uncompressed: qemu boots the ELF
#                   through its PVH note, skipping the bzImage's xz
#                   decompressor (about 2.5 s under TCG)
#   initramfs.img   static busybox + virtio/ext4 modules -> switch_root
#   rootfs.img      sparse ext4 image of a Debian root filesystem (mmdebstrap)
#                   with the kernel's modules, the storage tools and the
#                   command channel (guest/spindle-vm-run*)
#   stamp           the pins the guest was built from; versions.txt: every
#                   package in the guest with its version
#
# It is rebuilt only when a pin changes: the Debian suite and mirrors, the
# kernel and busybox package versions, the package list, the image size, or
# the content of this script and of guest/. The slow part, mmdebstrap's
# root filesystem (minutes on a busy 2-core machine), is cached on its own
# in $VM_CACHE/base (a tarball keyed by suite, mirrors, packages and the
# mmdebstrap options), so a change to the guest's configuration costs only
# the fast steps. VM_REBUILD=1 rebuilds everything.
# The kernel is the one linux-image-amd64 points to in this machine's apt
# lists (so it moves with `apt-get update`), or VM_KERNEL_PKG=NAME[=VERSION]
# (NAME a linux-image package or metapackage).
# Nothing is installed on the host: the kernel .deb is unpacked with dpkg -x.
# Every download (the .debs) is kept in $VM_CACHE/debs and reused; the
# build's logs are in $VM_CACHE/logs.
#
# Needs root (mmdebstrap's root mode, chroot) and the packages of
# hack/install-deps.sh. The initramfs is packed with the guest's static
# busybox (the host has no cpio); depmod runs in the chroot, on the guest's
# modules.
#
# Guest facts a test relies on: root has no password; eth0 (net.ifnames=0);
# the iSCSI InitiatorName is fixed at build time ($GUEST_IQN below), so every
# guest booted from this image has the same one: fine while one guest runs at a
# time (a guest script may rewrite /etc/iscsi/initiatorname.iscsi before its
# first iscsiadm call: iscsid is socket-activated and reads it when it starts).
# tgt.service and rtslib-fb-targetctl.service are installed but not enabled.
set -euo pipefail
# shellcheck source=hack/vm/lib.sh
. "$(dirname "$0")/lib.sh"

SUITE=${VM_SUITE:-bookworm}
IMAGE_SIZE=32G  # sparse; the overlay of each run grows only with what it writes
GUEST_IQN=iqn.2026-01.dev.spindle:vm-guest
PACKAGES=(
  systemd systemd-sysv udev dbus kmod util-linux mount procps psmisc
  iproute2 iputils-ping netcat-openbsd uuid-runtime strace less
  e2fsprogs xfsprogs btrfs-progs cryptsetup-bin
  # iSCSI: the kernel initiator, both targets (LIO via targetcli, tgt), tools
  open-iscsi targetcli-fb tgt lsscsi sg3-utils
  # libiscsi's iscsi-ls and iscsi-inq: the ACL tests check from the initiator side
  libiscsi-bin
  # Ceph RBD: rbd CLI (krbd map) and rbd-nbd
  ceph-common rbd-nbd
  # rbd-fuse: the RBD tests write into images with it (rbdtest.WriteImage)
  rbd-fuse
  # fio: the data-path benchmarks (e2e/datapath) on the kernel attach paths
  fio
)
# targetcli-fb opens the D-Bus system bus before anything else (for
# tcmu-runner) and fails every command without one: hence dbus above.

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, chroot)"
for prog in mmdebstrap apt-get apt-cache dpkg dpkg-deb xz mke2fs chroot gzip flock; do
  command -v "$prog" >/dev/null || die "$prog is missing; run hack/install-deps.sh"
done

T_START=$(now_us)
# debs/host: what apt-get download fetched (kernel, busybox);
# debs/guest: mmdebstrap's archives, synced in and out of the chroot.
mkdir -p "$VM_CACHE/debs/host" "$VM_CACHE/debs/guest" "$VM_CACHE/logs"
# One build at a time (two make runs in parallel would race on the cache).
exec 9>"$VM_CACHE/build.lock"
flock 9

# --- the pins ---------------------------------------------------------------
ARCH=$(dpkg --print-architecture)

# apt-cache with its binary cache kept here: this machine's apt config turns
# that cache off, and each call would parse every package list (1.3 s).
mkdir -p "$VM_CACHE/apt"
apt_cache() {
  apt-cache -o Dir::Cache::pkgcache="$VM_CACHE/apt/pkgcache.bin" \
    -o Dir::Cache::srcpkgcache="$VM_CACHE/apt/srcpkgcache.bin" "$@"
}
# resolve_pins: KPKG KVER (the kernel) and BBVER (busybox-static) from apt.
# linux-image-amd64 is a metapackage; the kernel is what it depends on.
resolve_pins() {
  local meta=${VM_KERNEL_PKG:-linux-image-amd64} info
  info=$(apt_cache show --no-all-versions "${meta%%=*}" busybox-static 2>/dev/null) || return 1
  BBVER=$(awk '/^Package:/ {p = $2} /^Version:/ && p == "busybox-static" {print $2}' <<<"$info")
  if [ "$meta" != "${meta%%=*}" ]; then
    KPKG=${meta%%=*} KVER=${meta#*=}
  else
    read -r KPKG KVER < <(awk -v m="$meta" '
      /^Package:/ {p = $2}
      p == m && /^Version:/ {v = $2}
      p == m && /^Depends:/ && match($0, /linux-image-[0-9][^ ,]* \(= [^)]*\)/) {
        split(substr($0, RSTART, RLENGTH), d, /[ ()=]+/); dp = d[1]; dv = d[2]
      }
      END {if (dp != "") print dp, dv; else if (v != "") print m, v}' <<<"$info")
  fi
  [ -n "${KPKG:-}" ] && [ -n "${KVER:-}" ] && [ -n "$BBVER" ]
}
if ! resolve_pins; then
  log "apt knows no linux-image-amd64/busybox-static; running apt-get update"
  apt-get update -qq
  resolve_pins || die "cannot resolve the kernel package (linux-image-amd64) from apt"
fi

# The guest uses this machine's Debian mirrors (the first enabled Debian and
# Debian security URIs of its apt sources), with the pinned suite.
host_uris() {
  awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true
  awk '$1 == "deb" {print ($2 ~ /^\[/) ? $3 : $2}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true
}
MIRROR=$(host_uris | awk '/\/debian\/?$/ {print; exit}')
SECURITY=$(host_uris | awk '/\/debian-security\/?$/ {print; exit}')
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}
SOURCES=("deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY $SUITE-security main")

# The mmdebstrap options: their text is part of the base's key.
MMDEBSTRAP_OPTS=(
  --variant=minbase --include="$(IFS=,; echo "${PACKAGES[*]}")"
  --aptopt='Acquire::Languages "none"'
  --aptopt='APT::Install-Recommends "false"'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  # No CA certificates: the guest talks to no TLS server, and with them
  # ca-certificates' postinst hashes ~150 certificates twice (45 s on a busy
  # machine).
  --dpkgopt='path-exclude=/usr/share/ca-certificates/*'
  # dpkg without fsyncs: a build that crashes is thrown away anyway.
  --dpkgopt='force-unsafe-io'
)
BASE_KEY="suite=$SUITE
sources=${SOURCES[*]}
packages=$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-16)
mmdebstrap=$(printf '%s\n' "${MMDEBSTRAP_OPTS[@]}" | sha256sum | cut -c1-16)"
SCRIPTS_HASH=$(cat "$VM_DIR/build.sh" "$VM_DIR"/guest/* | sha256sum | cut -c1-16)
KEY="$BASE_KEY
kernel=$KPKG=$KVER
busybox=busybox-static=$BBVER
image=$IMAGE_SIZE
scripts=$SCRIPTS_HASH"
BASE=$VM_CACHE/base

built() {
  [ -s "$GUEST_DIR/stamp" ] && [ "$(cat "$GUEST_DIR/stamp")" = "$KEY" ] &&
    [ -s "$GUEST_DIR/vmlinux" ] && [ -s "$GUEST_DIR/initramfs.img" ] && [ -s "$GUEST_DIR/rootfs.img" ]
}
if [ "${VM_REBUILD:-0}" != 1 ] && built; then
  echo "guest: cached in $GUEST_DIR (kernel $(cat "$GUEST_DIR/kernel.release"), $KPKG $KVER); $(since "$T_START") s"
  exit 0
fi
echo "guest: building in $GUEST_DIR ($SUITE, $KPKG $KVER)"

W=$VM_CACHE/build   # scratch: kernel/, busybox/, rootfs/, initramfs/, out/
cleanup() { rm -rf "$W"; }
trap cleanup EXIT
rm -rf "$W"
mkdir -p "$W/out"
OUT=$W/out
R=$W/rootfs

# phase NAME FUNCTION: runs one build step and prints how long it took.
phase() {
  local t0
  t0=$(now_us)
  "$2"
  echo "guest: phase $1: $(since "$t0") s"
}

# --- kernel: the linux-image .deb, unpacked, never installed -----------------
deb_path() { echo "$VM_CACHE/debs/host/${1}_${2//:/%3a}_${ARCH}.deb"; }
fetch_deb() { # PKG VERSION
  local f
  f=$(deb_path "$1" "$2")
  [ -s "$f" ] && return 0
  (cd "$VM_CACHE/debs/host" && apt-get download -q "$1=$2" >>"$VM_CACHE/logs/download.log" 2>&1) && [ -s "$f" ] && return 0
  # The version may have left the mirror since this machine's last apt-get
  # update: update once and start over (the pins may have moved).
  if [ "${VM_BUILD_UPDATED:-0}" != 1 ]; then
    log "cannot download $1=$2; running apt-get update and starting over"
    apt-get update -qq
    trap - EXIT; cleanup; flock -u 9
    VM_BUILD_UPDATED=1 exec "$0"
  fi
  die "cannot download $1=$2 (see $VM_CACHE/logs/download.log)"
}
kernel() {
  fetch_deb "$KPKG" "$KVER"
  fetch_deb busybox-static "$BBVER"
  dpkg -x "$(deb_path "$KPKG" "$KVER")" "$W/kernel"
  dpkg -x "$(deb_path busybox-static "$BBVER")" "$W/busybox"
  KREL=$(ls "$W/kernel/lib/modules")
  # Debian's vmlinuz is a bzImage with an xz payload (CONFIG_KERNEL_XZ): cut
  # at the first xz magic and decompress that one stream to the ELF vmlinux.
  local z=$W/kernel/boot/vmlinuz-$KREL off
  off=$(grep -obUaP -m1 '\xfd7zXZ\x00' "$z" | awk -F: 'NR == 1 {print $1}')
  [ -n "$off" ] || die "no xz stream in $z"
  tail -c +$((off + 1)) "$z" >"$W/vmlinux.xz"
  xz -dc --single-stream "$W/vmlinux.xz" >"$OUT/vmlinux"
  rm -f "$W/vmlinux.xz"
  [ "$(head -c4 "$OUT/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || die "vmlinux is not an ELF file"
  echo "$KREL" >"$OUT/kernel.release"
}

# --- rootfs: mmdebstrap's tarball, cached in $BASE, unpacked for customize ---
rootfs() {
  if [ "${VM_REBUILD:-0}" = 1 ] || [ ! -s "$BASE/rootfs.tar" ] || [ "$(cat "$BASE/stamp" 2>/dev/null)" != "$BASE_KEY" ]; then
    rm -rf "$BASE"
    mkdir -p "$BASE"
    # The .debs are synced into the chroot's apt archives and back out.
    # shellcheck disable=SC2016 # "$1" is for the hook's shell (the chroot)
    if ! mmdebstrap "${MMDEBSTRAP_OPTS[@]}" --format=tar \
      --skip=download/empty \
      --setup-hook='mkdir -p "$1"/var/cache/apt/archives' \
      --setup-hook="sync-in $VM_CACHE/debs/guest /var/cache/apt/archives/" \
      --customize-hook="sync-out /var/cache/apt/archives $VM_CACHE/debs/guest" \
      --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
      "$SUITE" "$BASE/rootfs.tar.tmp" "${SOURCES[@]}" >"$VM_CACHE/logs/mmdebstrap.log" 2>&1; then
      tail -30 "$VM_CACHE/logs/mmdebstrap.log" >&2
      die "mmdebstrap failed (log: $VM_CACHE/logs/mmdebstrap.log)"
    fi
    rm -rf "$VM_CACHE/debs/guest/lock" "$VM_CACHE/debs/guest/partial"
    mv "$BASE/rootfs.tar.tmp" "$BASE/rootfs.tar"
    echo "$BASE_KEY" >"$BASE/stamp"
  else
    echo "guest: mmdebstrap's root filesystem is cached in $BASE"
  fi
  mkdir -p "$R"
  tar -C "$R" --xattrs --xattrs-include='*' --numeric-owner -xf "$BASE/rootfs.tar"
}

# --- customize: modules, config, the command channel ---------------------------
customize() {
  mkdir -p "$R/usr/lib/modules"
  mv "$W/kernel/lib/modules/$KREL" "$R/usr/lib/modules/" # (scratch: a rename, no copy)
  cp "$W/kernel/boot/config-$KREL" "$W/kernel/boot/System.map-$KREL" "$R/boot/"
  chroot "$R" depmod -a "$KREL"

  echo spindle-vm >"$R/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 spindle-vm\n' >"$R/etc/hosts"
  echo '/dev/vda / ext4 rw,relatime,errors=remount-ro 0 1' >"$R/etc/fstab"
  : >"$R/etc/machine-id" # a fresh one every boot
  chroot "$R" passwd -d root >/dev/null
  echo "InitiatorName=$GUEST_IQN" >"$R/etc/iscsi/initiatorname.iscsi"
  # target_core_mod's db_root (LIO's persistent reservation and ALUA state);
  # without it the module logs "db_root: cannot open: /etc/target".
  mkdir -p "$R/etc/target"

  # INTERACTIVE=1 boots: root shell on the serial console without a login.
  mkdir -p "$R/etc/systemd/system/serial-getty@ttyS0.service.d"
  cat >"$R/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf" <<'UNIT'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --keep-baud 115200,57600,38400,9600 %I $TERM
UNIT

  # Boot time is test time under TCG: nothing that a throw-away guest does
  # not need. No networkd either: the command channel sets eth0's address.
  # rbdmap would map images listed in /etc/ceph/rbdmap at boot; binfmt,
  # drm, utmp serve nobody here. (logind stays: plain `poweroff` needs it.)
  local u
  for u in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
    e2scrub_reap.service fstrim.timer logrotate.timer systemd-tmpfiles-clean.timer \
    systemd-pstore.service getty@tty1.service getty-static.service \
    systemd-networkd-wait-online.service lvm2-monitor.service lvm2-lvmpolld.socket \
    blk-availability.service rbdmap.service \
    systemd-binfmt.service proc-sys-fs-binfmt_misc.automount \
    modprobe@drm.service systemd-update-utmp.service systemd-update-utmp-runlevel.service \
    systemd-journal-flush.service; do
    chroot "$R" systemctl mask "$u" >/dev/null 2>&1 || true
  done
  # The journal in memory only (a throw-away disk; no flush at boot).
  mkdir -p "$R/etc/systemd/journald.conf.d"
  printf '[Journal]\nStorage=volatile\n' >"$R/etc/systemd/journald.conf.d/spindle-vm.conf"
  # Targets start when a test asks for them, not at boot (tgtd would take
  # port 3260 that LIO needs; rtslib-fb-targetctl restores saved LIO config).
  for u in tgt.service rtslib-fb-targetctl.service; do
    chroot "$R" systemctl disable "$u" >/dev/null 2>&1 || true
  done

  install -m 0755 "$VM_DIR/guest/spindle-vm-run" "$R/usr/local/sbin/spindle-vm-run"
  install -m 0644 "$VM_DIR/guest/spindle-vm-run.service" "$R/etc/systemd/system/spindle-vm-run.service"
  chroot "$R" systemctl enable spindle-vm-run.service >/dev/null 2>&1
  # shellcheck disable=SC2016 # dpkg-query's own ${} fields
  chroot "$R" dpkg-query -W -f '${Package} ${Version}\n' >"$OUT/versions.txt"
}

# --- initramfs: static busybox + what mounting the root disk needs -------------
initramfs() {
  local I=$W/initramfs m
  mkdir -p "$I"/{bin,dev,proc,sys,newroot,lib/modules}
  cp "$W/busybox/bin/busybox" "$I/bin/busybox"
  install -m 0755 "$VM_DIR/guest/initramfs-init" "$I/init"
  # crc32c_generic first: ext4 needs crc32c (a softdep, so --show-depends
  # does not list it).
  for m in virtio_pci virtio_blk crc32c_generic ext4; do
    chroot "$R" modprobe -S "$KREL" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' | while read -r m; do
    cp "$R$m" "$I/lib/modules/"
    basename "$m" >>"$I/modules.list"
  done
  (cd "$I" && find . | "$W/busybox/bin/busybox" cpio -o -H newc 2>/dev/null | gzip -1) >"$OUT/initramfs.img"
}

# --- image: the rootfs directory as a sparse ext4 file (no loop, no mount) -----
image() {
  rm -f "$OUT/rootfs.img"; truncate -s "$IMAGE_SIZE" "$OUT/rootfs.img"
  mke2fs -q -t ext4 -L spindle-vm -E root_owner=0:0 -d "$R" "$OUT/rootfs.img"
}

phase kernel kernel
phase rootfs rootfs
phase customize customize
phase initramfs initramfs
phase image image

echo "$KEY" >"$OUT/stamp"
t=$(now_us)
rm -rf "$R" "$W/kernel" "$W/busybox" "$W/initramfs" # (seconds for ~1 GB of small files)
echo "guest: phase cleanup: $(since "$t") s"
rm -rf "$GUEST_DIR.old"
[ ! -d "$GUEST_DIR" ] || mv "$GUEST_DIR" "$GUEST_DIR.old"
mv "$OUT" "$GUEST_DIR"
rm -rf "$GUEST_DIR.old"
echo "guest: built in $(since "$T_START") s: kernel $KREL, $(wc -l <"$GUEST_DIR/versions.txt") packages," \
  "rootfs.img $(du -h "$GUEST_DIR/rootfs.img" | cut -f1) used of $IMAGE_SIZE, initramfs $(du -h "$GUEST_DIR/initramfs.img" | cut -f1)"
