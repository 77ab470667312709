package blockdev

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// SysfsSectorSize is the unit of sysfs's size attribute: 512 bytes,
// whatever the device's logical block size.
const SysfsSectorSize = 512

// Size reads the size in bytes of the block device dev (/dev/<name>) from
// <sysRoot>/block/<name>/size, without opening the device. A device that
// does not exist is ErrNotFound.
func Size(sysRoot, dev string) (int64, error) {
	return readSize(filepath.Join(sysRoot, "block", filepath.Base(dev), "size"), dev)
}

// SizeOfNumber reads the size in bytes of the block device with that
// device number, from /sys/dev/block/<major>:<minor>/size.
func SizeOfNumber(major, minor uint32) (int64, error) {
	return readSize(filepath.Join("/sys/dev/block", fmt.Sprintf("%d:%d", major, minor), "size"), fmt.Sprintf("%d:%d", major, minor))
}

func readSize(path, dev string) (int64, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0, errdefs.NotFound("block device %s does not exist", dev)
	}
	if err != nil {
		return 0, err
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return sectors * SysfsSectorSize, nil
}
