package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/spindle-csi/spindle/internal/atomicfile"
	"github.com/spindle-csi/spindle/internal/blockdev"
)

var _ Host = (*LinuxHost)(nil)

// Stat implements Host with one statx(2), and for a mount root one
// statfs(2): whether the path is a mount root (STATX_ATTR_MOUNT_ROOT, Linux
// 5.8) and which filesystem and device are there come from the path
// itself, never from the mount table, whose size grows with every volume
// the node holds.
func (h *LinuxHost) Stat(path string) (PathInfo, error) {
	var st unix.Statx_t
	err := h.statx(path, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		return PathInfo{}, nil
	case err != nil && mountutils.IsCorruptedMnt(err):
		return PathInfo{Exists: true, Dead: true}, nil
	case err != nil:
		return PathInfo{}, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	p := PathInfo{
		Exists:    true,
		Type:      fileMode(uint32(st.Mode)),
		Size:      int64(st.Size),
		Rdev:      DevNum{st.Rdev_major, st.Rdev_minor},
		Dev:       DevNum{st.Dev_major, st.Dev_minor},
		Ino:       st.Ino,
		MountRoot: st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0,
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		// A kernel before 5.8 does not say; its mount table does.
		m, err := h.MountAt(path)
		if err != nil {
			return PathInfo{}, err
		}
		p.MountRoot = m != nil
	}
	if !p.MountRoot {
		return p, nil
	}
	var fs unix.Statfs_t
	if err := h.kernel.Statfs(path, &fs); err != nil {
		if mountutils.IsCorruptedMnt(err) {
			return PathInfo{Exists: true, Dead: true}, nil
		}
		return PathInfo{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	p.FsType = filesystemTypes[int64(fs.Type)]
	p.ReadOnly = fs.Flags&unix.ST_RDONLY != 0
	switch {
	case p.Type != os.ModeDir:
		// A bind of a file or a device node: the filesystem is the one
		// the node lives on (devtmpfs), which says nothing of the device.
	case int64(fs.Type) == unix.BTRFS_SUPER_MAGIC:
		// btrfs gives its mounts an anonymous device number.
		p.Source, err = btrfsDevice(path)
		if err != nil {
			return PathInfo{}, err
		}
	case p.Dev.Major != 0:
		// Major 0 is an anonymous device: a filesystem on no block device.
		p.Source = p.Dev
	}
	return p, nil
}

// statx is the statx(2) the real host uses; tests do not replace it.
func (h *LinuxHost) statx(path string, st *unix.Statx_t) error {
	return unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT,
		unix.STATX_TYPE|unix.STATX_MODE|unix.STATX_INO|unix.STATX_SIZE, st)
}

// filesystemTypes names the statfs magic numbers of the filesystems the
// node mounts or meets at the paths it is given.
var filesystemTypes = map[int64]string{
	unix.EXT4_SUPER_MAGIC:  "ext4",
	unix.XFS_SUPER_MAGIC:   "xfs",
	unix.BTRFS_SUPER_MAGIC: "btrfs",
	unix.TMPFS_MAGIC:       "tmpfs",
}

// btrfsFSInfo is BTRFS_IOC_FS_INFO's struct btrfs_ioctl_fs_info_args.
type btrfsFSInfo struct {
	MaxID      uint64
	NumDevices uint64
	FSID       [16]byte
	_          [1024 - 32]byte
}

// btrfsIocFSInfo is _IOR(BTRFS_IOCTL_MAGIC, 31, struct btrfs_ioctl_fs_info_args).
const btrfsIocFSInfo = 0x8400941f

// btrfsDevice returns the block device of the (single-device) btrfs
// mounted at path: its fsid from the filesystem itself, then the device
// listed under /sys/fs/btrfs/<fsid>/devices.
func btrfsDevice(path string) (DevNum, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return DevNum{}, fmt.Errorf("open the btrfs root %s: %w", path, err)
	}
	defer unix.Close(fd)
	var info btrfsFSInfo
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), btrfsIocFSInfo, uintptr(unsafe.Pointer(&info))); errno != 0 {
		return DevNum{}, fmt.Errorf("BTRFS_IOC_FS_INFO on %s: %w", path, errno)
	}
	f := info.FSID
	fsid := fmt.Sprintf("%x-%x-%x-%x-%x", f[0:4], f[4:6], f[6:8], f[8:10], f[10:16])
	devices := filepath.Join("/sys/fs/btrfs", fsid, "devices")
	entries, err := os.ReadDir(devices)
	if err != nil {
		return DevNum{}, fmt.Errorf("the devices of the btrfs at %s: %w", path, err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(devices, e.Name(), "dev"))
		if err != nil {
			continue
		}
		if n, ok := parseDevNum(strings.TrimSpace(string(data))); ok {
			return n, nil
		}
	}
	return DevNum{}, fmt.Errorf("no device listed in %s for the btrfs at %s", devices, path)
}

// parseDevNum reads "major:minor".
func parseDevNum(s string) (DevNum, bool) {
	ma, mi, ok := strings.Cut(s, ":")
	if !ok {
		return DevNum{}, false
	}
	major, err1 := strconv.ParseUint(ma, 10, 32)
	minor, err2 := strconv.ParseUint(mi, 10, 32)
	if err1 != nil || err2 != nil {
		return DevNum{}, false
	}
	return DevNum{uint32(major), uint32(minor)}, true
}

// DirEmpty implements Host.
func (h *LinuxHost) DirEmpty(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

// MakeDir implements Host.
func (h *LinuxHost) MakeDir(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	if err := os.Mkdir(path, 0o750); err != nil && !os.IsExist(err) {
		return err
	}
	return nil
}

// MakeFile implements Host. O_NOFOLLOW: a symlink raced into the path is
// never followed.
func (h *LinuxHost) MakeFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

// Remove implements Host: rmdir(2) for a directory, unlink(2) otherwise,
// so a directory with entries is never removed.
func (h *LinuxHost) Remove(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	op, remove := "unlink", unix.Unlink
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		op, remove = "rmdir", unix.Rmdir
	}
	if err := remove(path); err != nil {
		return &os.PathError{Op: op, Path: path, Err: err}
	}
	return nil
}

// ReadFile implements Host.
func (h *LinuxHost) ReadFile(path string) ([]byte, error) { return os.ReadFile(path) }

// WriteFile implements Host: atomically, not synced (a stage record
// describes state that a power loss wipes out anyway).
func (h *LinuxHost) WriteFile(path string, data []byte) error {
	return atomicfile.WriteVolatile(path, data, 0o600)
}

// WriteRecord implements Host.
func (h *LinuxHost) WriteRecord(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o600)
}

// StageRecords implements Host.
func (h *LinuxHost) StageRecords(root string, mounts []Mount) ([]FoundStageRecord, error) {
	return FindStageRecords(root, mounts)
}

// Usage implements Host.
func (h *LinuxHost) Usage(path string) (FilesystemUsage, error) { return UsageOf(path) }

// DevicePath implements Host.
func (h *LinuxHost) DevicePath(n DevNum) string { return DevicePath(n.Major, n.Minor) }

// DeviceSize implements Host.
func (h *LinuxHost) DeviceSize(path string) (int64, error) { return h.deviceSize(path) }

// DeviceHeld implements Host.
func (h *LinuxHost) DeviceHeld(path string) (bool, error) { return blockdev.InUse(path) }

// DeviceOpeners implements Host.
func (h *LinuxHost) DeviceOpeners(path string) ([]blockdev.Opener, error) {
	return blockdev.Openers("/proc", path)
}

// Mkfs implements Host. mkfs is not cut short when the caller gives up: a
// half-written filesystem would look like a filesystem to the retry, which
// waits on the volume lock (ABORTED) until this one has finished.
func (h *LinuxHost) Mkfs(ctx context.Context, fs blockdev.Filesystem, options []string, dev string) error {
	mkfsCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mkfsTimeout)
	defer cancel()
	if _, err := h.run.Exec(mkfsCtx, fs.MkfsCommand(options, dev)); err != nil {
		return fmt.Errorf("create %s filesystem on %s: %w", fs.Name, dev, err)
	}
	return nil
}
