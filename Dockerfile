# The Spindle driver image, for users with Docker (or any OCI builder):
#
#   docker build -t ghcr.io/spindle-csi/spindle:dev .
#
# hack/images.sh assembles the same runtime from the Ceph root of
# hack/ceph/root.sh (the same Debian packages), without an engine.
#
# The driver's Ceph client is librados and librbd (cgo, go-ceph): built
# against trixie's headers (Reef's API; hack/go-tags.sh picks the tags),
# it runs with the libraries of the runtime image, which must log in to
# Tentacle's default keys (aes256k): Ceph 20.2.4 or newer, which Debian
# has in sid only. A Ceph base image (quay.io/ceph/ceph:v20) would do as
# well as the runtime stage, with the same package list.
FROM golang:1.26-trixie AS build
# gcc and libc6-dev: cgo (Docker Hub's golang image has them; the base
# make e2e-kind assembles offline does not).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev librados-dev librbd-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=v0.0.0-dev
RUN CGO_ENABLED=1 go build -tags "$(hack/go-tags.sh)" -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/spindle ./cmd/spindle

FROM debian:sid-slim
# e2fsprogs, xfsprogs, btrfs-progs: mkfs, fsck, grow; util-linux and mount:
# losetup, blkid, mount, findmnt; librados2, librbd1: the driver's Ceph
# client; ceph-common: rbd (krbd maps); rbd-nbd; open-iscsi: iscsiadm;
# kmod: modprobe, with which the node plugin loads rbd, nbd or iscsi_tcp
# (mount the host's /lib/modules); tgt: tgtadm, for a controller that
# manages a tgt target; cryptsetup-bin and dmsetup: encrypted volumes
# (dm-crypt, LUKS2); qemu-utils (qemu-storage-daemon) and
# qemu-block-extra (its rbd and iscsi drivers): the rbd-fuse mounter and
# the iSCSI userspace attacher, run by the attach daemon. The last line
# refuses a Ceph client older than 20.2.4.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       e2fsprogs xfsprogs btrfs-progs util-linux mount librados2 librbd1 ceph-common rbd-nbd open-iscsi kmod tgt \
       cryptsetup-bin dmsetup qemu-utils qemu-block-extra ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && rbd --version | grep -Eq 'ceph version (20\.2\.([4-9]|[1-9][0-9])|2[1-9]\.)'
COPY --from=build /out/spindle /usr/local/bin/spindle
ENTRYPOINT ["/usr/local/bin/spindle"]
