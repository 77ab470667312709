#!/bin/sh
# mmdebstrap --customize-hook of hack/kind/node-image.sh: makes the Debian
# root filesystem in $1 what kind's images/base/Dockerfile makes of its
# Debian image after the package installs, with this machine's fixes.
# Needs KIND_FILES (kind's images/base/files), CRICTL (a crictl binary) and
# NO_SYS_RESOURCE (1 when root lacks CAP_SYS_RESOURCE).
set -eu
R=$1
F=$KIND_FILES

# kind's files, with the Dockerfile's modes (scripts 0755, the rest 0644).
mkdir -p "$R/kind/bin" "$R/LICENSES" "$R/etc/containerd" "$R/etc/systemd/system/kubelet.service.d" "$R/etc/kubernetes/manifests"
install -m 0755 "$F"/usr/local/bin/* "$R/usr/local/bin/"
install -m 0644 "$F"/kind/README.txt "$R/kind/"
install -m 0755 "$F"/kind/bin/* "$R/kind/bin/"
chmod 0755 "$R/kind" "$R/kind/bin"
install -m 0644 "$F"/LICENSES/* "$R/LICENSES/"
install -m 0644 "$F"/etc/crictl.yaml "$R/etc/"
install -m 0644 "$F"/etc/containerd/* "$R/etc/containerd/"
install -m 0644 "$F"/etc/default/* "$R/etc/default/"
install -m 0644 "$F"/etc/sysctl.d/* "$R/etc/sysctl.d/"
find "$F/etc/systemd/system" -maxdepth 1 -type f -exec install -m 0644 {} "$R/etc/systemd/system/" \;
install -m 0644 "$F"/etc/systemd/system/kubelet.service.d/* "$R/etc/systemd/system/kubelet.service.d/"
install -m 0755 "$CRICTL" "$R/usr/local/bin/crictl"

# kind waits for a node until its log says "Reached target Multi-User
# System" or, on cgroup v1, until the entrypoint says "detected cgroup v1",
# which it does before systemd starts; kind's next commands then raced
# systemd here (no containerd socket, "System has not been booted with
# systemd"). Reworded, the line no longer matches and kind waits for
# systemd on cgroup v1 too.
sed -i "s/log_info 'detected cgroup v1'/log_info 'detected cgroup version 1'/" "$R/usr/local/bin/entrypoint"

# kind's units and scripts name upstream's install paths; Debian's
# containerd is in /usr/bin and its CNI plugins in /usr/lib/cni.
for b in containerd ctr containerd-shim-runc-v2; do ln -sf "/usr/bin/$b" "$R/usr/local/bin/$b"; done
mkdir -p "$R/opt/cni/bin"
for p in host-local loopback ptp portmap; do ln -sf "/usr/lib/cni/$p" "$R/opt/cni/bin/$p"; done

# The Dockerfile's unit clean-up, and systemd as init.
find "$R/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \
  "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \
  "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$R/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$R/sbin/init"
chroot "$R" systemctl enable kubelet.service containerd.service undo-mount-hacks.service
chroot "$R" systemctl mask systemd-binfmt.service

# A node is privileged: its /proc/sys is writable, so systemd-sysctl's
# settings of sysctls that are not per network namespace would be the whole
# machine's (Debian's fs.protected_* and kernel.pid_max went from 0 to 1/2
# here). kind's own 10-network-*.conf are per namespace and stay.
rm -f "$R/usr/lib/sysctl.d/99-protect-links.conf" "$R/usr/lib/sysctl.d/50-pid-max.conf"
# The nodes get the host's /dev (loop devices): the node's systemd must not
# chown or chmod the host's device nodes to the node's groups.
chroot "$R" systemctl mask systemd-tmpfiles-setup-dev.service

# containerd's base OCI spec, as the Dockerfile makes it.
chroot "$R" sh -c 'ctr oci spec |
  jq ".hooks.createContainer[.hooks.createContainer | length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}" |
  jq "del(.process.rlimits)" >/etc/containerd/cri-base.json'

if [ "$NO_SYS_RESOURCE" = 1 ]; then
  # Without CAP_SYS_RESOURCE no process may lower its oom_score_adj: the
  # pods' containers keep containerd's (as kind's entrypoint arranges for
  # rootless nodes), and systemd does not try to lower containerd's.
  sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$R/etc/containerd/config.toml"
  mkdir -p "$R/etc/systemd/system/containerd.service.d"
  printf '[Service]\nOOMScoreAdjust=0\n' >"$R/etc/systemd/system/containerd.service.d/20-no-sys-resource.conf"
fi

# Nothing of apt is needed at run time.
rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin "$R"/var/cache/debconf/*-old "$R"/var/log/*
