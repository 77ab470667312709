package node

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/spindle-csi/spindle/internal/blockdev"
)

// FilesystemUsage is what a mounted filesystem reports.
type FilesystemUsage struct {
	TotalBytes, UsedBytes, AvailableBytes    int64
	TotalInodes, UsedInodes, AvailableInodes int64
}

// UsageOf returns the usage of the filesystem mounted at path.
func UsageOf(path string) (FilesystemUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FilesystemUsage{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	// statfs counts blocks in fragment-size units (f_frsize); on Linux it
	// equals f_bsize for the filesystems Spindle makes, but Frsize is the
	// one POSIX defines the counts in.
	bs := int64(st.Frsize)
	if bs == 0 {
		bs = int64(st.Bsize)
	}
	return FilesystemUsage{
		TotalBytes:      int64(st.Blocks) * bs,
		UsedBytes:       int64(st.Blocks-st.Bfree) * bs,
		AvailableBytes:  int64(st.Bavail) * bs,
		TotalInodes:     int64(st.Files),
		UsedInodes:      int64(st.Files - st.Ffree),
		AvailableInodes: int64(st.Ffree),
	}, nil
}

// BlockDeviceAt returns the device number of the block device node at path
// (a device file, or a file a device node is bind-mounted on), or ok=false
// when path is something else.
func BlockDeviceAt(path string) (major, minor uint32, ok bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, 0, false, nil
	}
	return unix.Major(st.Rdev), unix.Minor(st.Rdev), true, nil
}

// BlockDeviceSize returns the size of the block device node at path, or an
// error when path is no block device.
func BlockDeviceSize(path string) (int64, error) {
	major, minor, err := DeviceNumber(path)
	if err != nil {
		return 0, err
	}
	return blockdev.SizeOfNumber(major, minor)
}

// DevicePath names the device node of a device number as the kernel does
// (/dev/<name>, the name read from /sys/dev/block/<major>:<minor>), or ""
// when the number is no block device.
func DevicePath(major, minor uint32) string {
	target, err := os.Readlink(filepath.Join("/sys/dev/block", fmt.Sprintf("%d:%d", major, minor)))
	if err != nil {
		return ""
	}
	return "/dev/" + filepath.Base(target)
}
