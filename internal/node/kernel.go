package node

import (
	"golang.org/x/sys/unix"
)

// kernelMounts is the part of the kernel's mount API the data path calls
// directly. Bind mounts, read-only remounts and unmounts take no options
// to parse, so running mount(8) or umount(8) for them would only add a
// process start to every NodePublish, NodeUnpublish and NodeUnstage.
// Filesystem mounts still go through mount(8), which knows every
// filesystem's options. FakeKernelMounts stands in for it in tests.
type kernelMounts interface {
	Mount(source, target, fstype string, flags uintptr, data string) error
	Unmount(target string, flags int) error
	Statfs(path string, st *unix.Statfs_t) error
}

// linuxMounts is the real kernelMounts.
type linuxMounts struct{}

func (linuxMounts) Mount(source, target, fstype string, flags uintptr, data string) error {
	return unix.Mount(source, target, fstype, flags, data)
}

func (linuxMounts) Unmount(target string, flags int) error { return unix.Unmount(target, flags) }

func (linuxMounts) Statfs(path string, st *unix.Statfs_t) error { return unix.Statfs(path, st) }

// perMountFlags turns the per-mount flags statfs reports into mount(2)
// flags. A bind remount replaces all of them, so a read-only remount must
// repeat the ones already set or it would, say, drop nosuid.
func perMountFlags(stFlags int64) uintptr {
	var out uintptr
	for st, ms := range map[int64]uintptr{
		unix.ST_NOSUID:     unix.MS_NOSUID,
		unix.ST_NODEV:      unix.MS_NODEV,
		unix.ST_NOEXEC:     unix.MS_NOEXEC,
		unix.ST_NOATIME:    unix.MS_NOATIME,
		unix.ST_NODIRATIME: unix.MS_NODIRATIME,
		unix.ST_RELATIME:   unix.MS_RELATIME,
	} {
		if stFlags&st != 0 {
			out |= ms
		}
	}
	return out
}
