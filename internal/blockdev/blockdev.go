// Package blockdev holds the facts of block devices that every layer needs
// and none owns: the in-use check before a device is let go, a device's
// size from sysfs, loop devices (LoopDevices) with Spindle's one geometry,
// what blkid finds on a device or an image file (Blkid, Signature), the
// filesystems Spindle makes (LookupFilesystem) and what a LUKS2 header
// takes of a device. It is a leaf: the node, the controller and the
// backends import it, and it imports none of them.
package blockdev

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// InUse opens dev exclusively: the kernel refuses that (EBUSY) while a
// filesystem is mounted on it, a device mapper holds it, or another process
// opened it with O_EXCL. A process holding it open without O_EXCL is not
// seen. A device that is gone (ENOENT, ENXIO) is not in use.
func InUse(dev string) (bool, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err == nil {
		_ = unix.Close(fd)
		return false, nil
	}
	if errors.Is(err, unix.EBUSY) {
		return true, nil
	}
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) {
		return false, nil
	}
	return false, fmt.Errorf("open %s exclusively: %w", dev, err)
}
