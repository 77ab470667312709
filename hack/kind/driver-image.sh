#!/usr/bin/env bash
# hack/kind/driver-image.sh TAG: the driver image, built from the
# Dockerfile as users build it (`docker build`), with Docker's layer cache.
#
# The Dockerfile's base images (FROM) are used as Docker has them, else
# pulled; where no registry answers, they are made here from Debian root
# filesystems (mmdebstrap) under the same names, so the Dockerfile stays
# as it is for everyone else:
#   debian:SUITE-slim    Debian SUITE minbase, apt sourcing the host's mirror
#   golang:VER-SUITE     the same with ca-certificates (and the CAs this
#                        machine adds), and its Go toolchain in
#                        /usr/local/go when it is Go VER; GOPROXY and
#                        GOSUMDB as `go env` says here
# Each made image carries the label dev.spindle.pins (its name, the Go
# version, the CAs and the code that makes it) and is made again only when
# that changes.
#
# The build runs in the host's network namespace (--network host): the
# Dockerfile's `go mod download` and `apt-get install` reach the module
# proxy and the Debian mirror the way this machine does, also where the
# Docker bridge has no route out (hack/kind/docker.sh keeps forwarding off).
#
# Env: MIRROR (the host's first Debian mirror), VERSION (git describe).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
TAG=${1:?usage: hack/kind/driver-image.sh TAG}
VERSION=${VERSION:-$(git -C "$REPO" describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)}
LABEL=dev.spindle.pins
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
log() { echo "driver-image: $*" >&2; }

# shellcheck source=hack/kind/debian.sh
. "$HERE/debian.sh"

# rootfs SUITE OUT.tar [PACKAGE,...] [HOOK]: Debian minbase.
rootfs() {
  local include=${3:-} hook=${4:-true}
  debian_rootfs "$1" "$2" --variant=minbase ${include:+--include="$include"} --customize-hook="$hook" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*'
}

# pins_of IMAGE: the pins IMAGE was made with here; empty for one pulled.
pins_of() { docker image inspect -f "{{with .Config.Labels}}{{index . \"$LABEL\"}}{{end}}" "$1"; }

# offline IMAGE PINS: IMAGE made from a Debian root filesystem.
offline() {
  local image=$1 pins=$2 tmp
  tmp=$(mktemp -d /var/tmp/spindle-driver-base.XXXXXX)
  case $image in
  debian:*-slim)
    local suite=${image#debian:}
    rootfs "${suite%-slim}" "$tmp/rootfs.tar"
    docker import --change 'CMD ["bash"]' --change "LABEL $LABEL=\"$pins\"" "$tmp/rootfs.tar" "$image" >/dev/null
    ;;
  golang:*-*)
    local tag=${image#golang:} goroot
    local version=${tag%%-*} suite=${tag#*-}
    case $(go env GOVERSION) in
    "go$version" | "go$version".*) ;;
    *) log "$image: this machine's Go is $(go env GOVERSION), not $version; pull the image or install Go $version"; exit 1 ;;
    esac
    goroot=$(go env GOROOT)
    # The CAs this machine adds to Debian's (/usr/local/share/ca-certificates:
    # a proxy's, a company's) come along: `go mod download` in the image
    # reaches the module proxy as this machine does.
    rootfs "$suite" "$tmp/rootfs.tar" ca-certificates "mkdir -p \"\$1/usr/local\" \"\$1/go\" && cp -a $goroot \"\$1/usr/local/go\" &&
      cp -r /usr/local/share/ca-certificates/. \"\$1/usr/local/share/ca-certificates/\" && chroot \"\$1\" update-ca-certificates >/dev/null"
    local changes=(--change "ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
      --change "ENV GOLANG_VERSION=$(go env GOVERSION | sed 's/^go//')" --change "ENV GOPATH=/go" --change "ENV GOTOOLCHAIN=local"
      --change "WORKDIR /go" --change 'CMD ["bash"]' --change "LABEL $LABEL=\"$pins\"")
    local v
    for v in GOPROXY GOSUMDB GONOSUMDB GOPRIVATE GONOPROXY; do
      [ -z "$(go env "$v")" ] || changes+=(--change "ENV $v=$(go env "$v")")
    done
    docker import "${changes[@]}" "$tmp/rootfs.tar" "$image" >/dev/null
    ;;
  *)
    rm -rf "$tmp"
    log "$image cannot be pulled and there is no recipe to make it here"
    exit 1
    ;;
  esac
  rm -rf "$tmp"
}

for image in $(awk 'toupper($1) == "FROM" {print $2}' "$REPO/Dockerfile" | sort -u); do
  pins="$image go=$(go env GOVERSION) cas=$(cat /usr/local/share/ca-certificates/* 2>/dev/null | sha256sum | cut -c1-12)"
  pins+=" $(declare -f offline rootfs debian_rootfs | sha256sum | cut -c1-12)"
  if docker image inspect "$image" >/dev/null 2>&1; then
    case $(pins_of "$image") in
    "" | "$pins") continue ;; # pulled, or made here with these pins
    esac
  fi
  if timeout 60 docker pull -q "$image" >/dev/null 2>&1; then
    log "pulled $image"
    continue
  fi
  log "$image cannot be pulled: making it from Debian's packages"
  start=$SECONDS
  offline "$image" "$pins"
  log "made $image in $((SECONDS - start))s"
done

start=$SECONDS
DOCKER_BUILDKIT=0 docker build -q --network host --build-arg VERSION="$VERSION" -t "$TAG" "$REPO" >/dev/null
log "built $TAG from the Dockerfile in $((SECONDS - start))s"
