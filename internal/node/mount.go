package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// LinuxHost is the real Host: the kernel's mount calls, mount(8) and the
// filesystem tools through command.Runner, statx and sysfs.
type LinuxHost struct {
	run           *command.Runner
	kernel        kernelMounts
	mountInfoPath string
	// deviceSize returns the size of the block device at a path, and fails
	// for anything that is not a block device. Tests replace it.
	deviceSize func(path string) (int64, error)
	// blockDeviceAt is BlockDeviceAt; tests replace it.
	blockDeviceAt func(path string) (major, minor uint32, ok bool, err error)
	// programsHaveCapability tells whether the programs the host runs
	// get a capability; tests replace it.
	programsHaveCapability func(capBit uint) (bool, error)
	// procMisc and sysDevBlock are /proc/misc and /sys/dev/block, where
	// the device mapper and its mappings are read (crypt.go).
	procMisc, sysDevBlock string
	// cryptReady: dm-crypt was found usable once; it stays so.
	cryptReady atomic.Bool
}

// NewLinuxHost returns the real host, running its commands through run.
func NewLinuxHost(run *command.Runner) *LinuxHost {
	return &LinuxHost{
		run: run, kernel: linuxMounts{}, mountInfoPath: "/proc/self/mountinfo",
		deviceSize: BlockDeviceSize, blockDeviceAt: BlockDeviceAt,
		programsHaveCapability: programsHaveCapability,
		procMisc:               "/proc/misc", sysDevBlock: "/sys/dev/block",
	}
}

// Mount is one entry of the mount table, with paths unescaped.
type Mount struct {
	ID         int
	Major      int
	Minor      int
	Root       string
	Source     string
	MountPoint string
	FsType     string
	Options    []string // per-mount options: rw/ro, nosuid, ...
	// SuperOptions are the filesystem's own options, shared by all its
	// mounts: rw/ro, errors=remount-ro, ...
	SuperOptions []string
}

// ReadOnly reports whether the mount is read-only.
func (m *Mount) ReadOnly() bool {
	for _, o := range m.Options {
		if o == "ro" {
			return true
		}
	}
	return false
}

// Mounts reads the mount table.
func (d *LinuxHost) Mounts() ([]Mount, error) {
	infos, err := mountutils.ParseMountInfo(d.mountInfoPath)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.mountInfoPath, err)
	}
	out := make([]Mount, 0, len(infos))
	for _, mi := range infos {
		out = append(out, Mount{
			ID: mi.ID, Major: mi.Major, Minor: mi.Minor,
			Root: unescapeOctal(mi.Root), Source: unescapeOctal(mi.Source),
			MountPoint: unescapeOctal(mi.MountPoint), FsType: mi.FsType, Options: mi.MountOptions,
			SuperOptions: mi.SuperOptions,
		})
	}
	return out, nil
}

// unescapeOctal undoes the kernel's \040-style escaping of spaces, tabs,
// newlines and backslashes in mountinfo paths.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Resolve returns the path as the mount table shows it: symlinks resolved.
// A path that cannot be resolved (missing, or a dead mount) is only cleaned.
func Resolve(path string) string {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	if r, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		return filepath.Join(r, filepath.Base(path))
	}
	return filepath.Clean(path)
}

// MountAt returns the top-most mount at path, or nil when path is not a
// mount point.
func (d *LinuxHost) MountAt(path string) (*Mount, error) {
	mounts, err := d.Mounts()
	if err != nil {
		return nil, err
	}
	return topMountAt(mounts, Resolve(path)), nil
}

func topMountAt(mounts []Mount, path string) *Mount {
	var top *Mount
	for i := range mounts {
		if mounts[i].MountPoint == path {
			top = &mounts[i] // later entries are mounted on top of earlier ones
		}
	}
	return top
}

// DeviceNumber returns the device number (st_rdev) of a device node.
func DeviceNumber(dev string) (major, minor uint32, err error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return 0, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, 0, errdefs.InvalidArgument("%s is not a block device", dev)
	}
	return unix.Major(st.Rdev), unix.Minor(st.Rdev), nil
}

// IsMountOf reports whether m is a filesystem mounted from dev. The device
// number identifies ext4 and xfs; btrfs mounts carry an anonymous device
// number, so the source path is compared too.
func (m *Mount) IsMountOf(dev string, major, minor uint32) bool {
	if m.Major == int(major) && m.Minor == int(minor) {
		return true
	}
	return m.Source == dev
}

// MountDevice mounts dev on target as fsType with options.
func (d *LinuxHost) MountDevice(ctx context.Context, dev, target, fsType string, options []string) error {
	args := []string{"-t", fsType}
	if len(options) > 0 {
		args = append(args, "-o", strings.Join(options, ","))
	}
	args = append(args, dev, target)
	if _, err := d.run.Run(ctx, "mount", args...); err != nil {
		return fmt.Errorf("mount %s on %s: %w", dev, target, err)
	}
	return nil
}

// BindMount makes source visible at target; readOnly remounts the bind
// read-only, which the kernel only allows as a second step.
func (d *LinuxHost) BindMount(ctx context.Context, source, target string, readOnly bool) error {
	if err := d.kernel.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", source, target, err)
	}
	if readOnly {
		return d.RemountReadOnly(ctx, target)
	}
	return nil
}

// RemountReadOnly makes an existing bind mount read-only, keeping its other
// per-mount flags.
func (d *LinuxHost) RemountReadOnly(_ context.Context, target string) error {
	var st unix.Statfs_t
	if err := d.kernel.Statfs(target, &st); err != nil {
		return fmt.Errorf("make %s read-only: %w", target, err)
	}
	flags := unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | perMountFlags(st.Flags)
	if err := d.kernel.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", target, err)
	}
	return nil
}

// maxStackedMounts bounds the unmount loop; more mounts than this stacked
// on one path means something else is mounting there.
const maxStackedMounts = 8

// Unmount removes every mount stacked at target, top first, until the
// kernel says nothing is mounted there (EINVAL). A path that is not
// mounted, or does not exist, is fine; a busy mount is a precondition
// failure, since unmounting it lazily would hide a device still in use.
func (d *LinuxHost) Unmount(_ context.Context, target string) error {
	for unmounted := 0; ; unmounted++ {
		// UMOUNT_NOFOLLOW: a symlink put in place of a mount point is
		// never followed to unmount whatever it points at.
		err := d.kernel.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY):
			return errdefs.Wrap(errdefs.ErrPrecondition, err, "%s is still in use", target)
		case err != nil:
			return fmt.Errorf("unmount %s: %w", target, err)
		case unmounted == maxStackedMounts:
			return fmt.Errorf("%s is still mounted after %d unmounts", target, maxStackedMounts+1)
		}
	}
}
