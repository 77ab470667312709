# The Spindle driver image, for users with Docker (or any OCI builder):
#
#   docker build -t ghcr.io/spindle-csi/spindle:dev .
#
# hack/images.sh assembles the same runtime (the static binary plus the
# filesystem and block tools) from this machine's files, without an engine.
FROM golang:1.26-trixie AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=v0.0.0-dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/spindle ./cmd/spindle

FROM debian:trixie-slim
# e2fsprogs, xfsprogs, btrfs-progs: mkfs, fsck, grow; util-linux and mount:
# losetup, blkid, mount, findmnt; open-iscsi: iscsiadm; ceph-common: rbd;
# rbd-nbd and rbd-fuse: the other two RBD mounters; kmod: modprobe, with
# which the node plugin loads rbd, nbd or iscsi_tcp (mount the host's
# /lib/modules); tgt: tgtadm, for a controller that manages a tgt target;
# cryptsetup-bin and dmsetup: encrypted volumes (dm-crypt, LUKS2);
# qemu-system-common (qemu-storage-daemon) and qemu-block-extra (its iSCSI
# driver): the iSCSI userspace attacher, run by the attach daemon.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
       e2fsprogs xfsprogs btrfs-progs util-linux mount open-iscsi ceph-common rbd-nbd rbd-fuse kmod tgt cryptsetup-bin dmsetup \
       qemu-system-common qemu-block-extra ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/spindle /usr/local/bin/spindle
ENTRYPOINT ["/usr/local/bin/spindle"]
