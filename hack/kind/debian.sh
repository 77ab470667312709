# Debian root filesystems for hack/kind's offline images; sourced, not run.
# shellcheck shell=bash
# MIRROR is the host's own Debian mirror (its first deb822 or one-line
# source) unless set; SECURITY its security archive.
if [ -z "${MIRROR:-}" ]; then
  MIRROR=$({ grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true; } |
    awk '{print $2}' | head -n1)
fi
SECURITY=${SECURITY:-${MIRROR%/debian*}/debian-security}

# debian_rootfs SUITE OUT.tar MMDEBSTRAP-ARGS...: Debian SUITE as a tarball,
# without manuals, documentation (but the copyright files) or translations,
# apt sourcing MIRROR (as Debian's own images source deb.debian.org).
debian_rootfs() {
  local suite=$1 out=$2
  shift 2
  [ -n "$MIRROR" ] || { echo "no Debian mirror in /etc/apt/sources*: set MIRROR" >&2; return 1; }
  local sources=("deb $MIRROR $suite main" "deb $MIRROR $suite-updates main" "deb $SECURITY $suite-security main")
  if [ "$suite" = sid ] || [ "$suite" = unstable ]; then
    # sid has no updates or security suites; a mirror's snapshot of it
    # carries Release files past their Valid-Until, which apt refuses
    # unless told, in the root and in whatever builds on it.
    sources=("deb $MIRROR $suite main")
    set -- "$@" --aptopt='Acquire::Check-Valid-Until "false"'
  fi
  mmdebstrap --mode=root --format=tar --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' "$@" "$suite" "$out" "${sources[@]}" </dev/null
}
