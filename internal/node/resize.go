package node

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spindle-csi/spindle/internal/blockdev"
	"github.com/spindle-csi/spindle/internal/command"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// offlineGrowTimeout bounds e2fsck and resize2fs on an unmounted ext4. Both
// rewrite metadata in place, so neither is cut short when the caller gives
// up: a resize2fs killed half-way leaves a damaged filesystem. The bound is
// generous because a full check of a large, full filesystem takes minutes.
const offlineGrowTimeout = 30 * time.Minute

// FilesystemSize returns the bytes the fsType filesystem on dev spans, as
// its own metadata records them, without mounting it:
//
//   - ext4: "dumpe2fs -h" block count × block size, from the superblock
//     (ext4 keeps its superblock in the block device's page cache, which
//     dumpe2fs reads, so a mounted ext4 answers current figures too);
//   - xfs: "xfs_info", data blocks × block size. xfs_info asks the kernel
//     when the device is mounted and reads the superblock otherwise; the
//     superblock on disk alone (xfs_db) still shows the old size after an
//     online xfs_growfs, even after sync, until the filesystem is unmounted;
//   - btrfs: "btrfs inspect-internal dump-super" dev_item.total_bytes, the
//     part of the filesystem on this device (total_bytes is the sum over all
//     of a filesystem's devices).
//
// It works mounted or not. An output it cannot read is an error naming the
// command.
func (d *LinuxHost) FilesystemSize(ctx context.Context, dev, fsType string) (int64, error) {
	var (
		args  []string
		parse func([]byte) (int64, error)
	)
	switch fsType {
	case "ext4":
		args, parse = []string{"dumpe2fs", "-h", dev}, parseDumpe2fsSize
	case "xfs":
		args, parse = []string{"xfs_info", dev}, parseXFSInfoSize
	case "btrfs":
		args, parse = []string{"btrfs", "inspect-internal", "dump-super", dev}, parseBtrfsSuperSize
	default:
		_, err := blockdev.FilesystemNamed(fsType)
		return 0, err
	}
	out, err := d.run.Run(ctx, args[0], args[1:]...)
	if err != nil {
		return 0, fmt.Errorf("read the size of the %s filesystem on %s: %w", fsType, dev, err)
	}
	size, err := parse(out)
	if err != nil {
		return 0, fmt.Errorf("read the size of the %s filesystem on %s: %s: %w", fsType, dev, strings.Join(args, " "), err)
	}
	return size, nil
}

// parseDumpe2fsSize reads "Block count:" and "Block size:" from dumpe2fs -h.
func parseDumpe2fsSize(out []byte) (int64, error) {
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if ok {
			fields[strings.TrimSpace(key)] = strings.TrimSpace(value)
		}
	}
	return blocksTimesSize(fields, "Block count", "Block size")
}

// parseXFSInfoSize reads the data section's bsize= and blocks= from
// xfs_info's "data     =    bsize=4096   blocks=153600, imaxpct=25" line.
// The naming, log and realtime lines carry the same keys, so only the line
// that starts with "data" counts.
func parseXFSInfoSize(out []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		section, values, ok := strings.Cut(sc.Text(), "=")
		if !ok || strings.TrimSpace(section) != "data" {
			continue
		}
		fields := map[string]string{}
		for _, f := range strings.Fields(values) {
			if k, v, ok := strings.Cut(strings.TrimSuffix(f, ","), "="); ok {
				fields[k] = v
			}
		}
		return blocksTimesSize(fields, "blocks", "bsize")
	}
	return 0, fmt.Errorf("no data section line (data = bsize=... blocks=...) in its output %q", excerpt(out))
}

// parseBtrfsSuperSize reads "dev_item.total_bytes" from dump-super.
func parseBtrfsSuperSize(out []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "dev_item.total_bytes" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("dev_item.total_bytes %q is no size", f[1])
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no dev_item.total_bytes in its output %q", excerpt(out))
}

// blocksTimesSize multiplies the block count and block size found under
// the two keys, refusing missing, non-positive and overflowing values.
func blocksTimesSize(fields map[string]string, countKey, sizeKey string) (int64, error) {
	var n [2]int64
	for i, key := range []string{countKey, sizeKey} {
		v, ok := fields[key]
		if !ok {
			return 0, fmt.Errorf("no %q in its output", key)
		}
		x, err := strconv.ParseInt(v, 10, 64)
		if err != nil || x <= 0 {
			return 0, fmt.Errorf("%s %q is no positive number", key, v)
		}
		n[i] = x
	}
	if n[0] > math.MaxInt64/n[1] {
		return 0, fmt.Errorf("%s %d × %s %d overflows", countKey, n[0], sizeKey, n[1])
	}
	return n[0] * n[1], nil
}

// excerpt shortens a command's output for an error message.
func excerpt(out []byte) string {
	const max = 300
	s := strings.TrimSpace(string(out))
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}

// needsGrow reports whether the fsType filesystem on dev is smaller than the
// device by more than the tail that filesystem leaves unused anyway (see
// blockdev.Filesystem.MaxUnusedTail), that is, whether the device grew since the
// filesystem was made or last grown. It works mounted or not; NodeStage
// calls it before mounting an ext4 (which grows offline) and after mounting
// an xfs or btrfs (which grow only mounted). A volume staged read-only
// cannot grow (the tools need to write), so it is not worth asking then. A
// filesystem larger than its device is a precondition failure: its end is
// unreadable.
func needsGrow(ctx context.Context, h Host, dev, fsType string) (bool, error) {
	fs, err := blockdev.FilesystemNamed(fsType)
	if err != nil {
		return false, err
	}
	deviceBytes, err := h.DeviceSize(dev)
	if err != nil {
		return false, fmt.Errorf("size of %s: %w", dev, err)
	}
	fsBytes, err := h.FilesystemSize(ctx, dev, fsType)
	if err != nil {
		return false, err
	}
	if fsBytes > deviceBytes {
		return false, errdefs.Precondition("the %s filesystem on %s spans %d bytes, more than the device's %d; its end cannot be read (was the image shrunk, or the device not refreshed?)",
			fsType, dev, fsBytes, deviceBytes)
	}
	return deviceBytes-fsBytes > fs.MaxUnusedTail(), nil
}

// GrowFilesystem grows the fsType filesystem on dev to fill the device.
// mountPath is where it is mounted (the staging path or a pod's bind of it),
// or "" when it is not mounted:
//
//   - ext4, not mounted: "e2fsck -f -p dev" then "resize2fs dev" (resize2fs
//     refuses an offline grow unless the filesystem was checked since it was
//     last mounted). e2fsck exit 1 and 2 (errors corrected) are fine; any
//     worse exit is a precondition failure and nothing is resized; a forced
//     repair is never attempted;
//   - ext4, mounted: "resize2fs dev" (online; mountPath is not needed, as
//     resize2fs finds the mount itself). The kernel only allows it with
//     CAP_SYS_RESOURCE; without it the error is a precondition failure that
//     says to restage the volume, which grows it offline;
//   - xfs: "xfs_growfs mountPath"; btrfs: "btrfs filesystem resize max
//     mountPath". Both grow only mounted; asked with mountPath "" they fail
//     with a precondition error and run nothing. Both need a read-write
//     mount: given a read-only one (a pod's read-only bind), they grow
//     through a read-write mount of the same device (the staging path).
//
// Growing a filesystem that already fills its device changes nothing and
// succeeds (resize2fs "Nothing to do!", xfs_growfs and btrfs exit 0), so a
// retry is safe. Callers that want to skip the offline ext4 check when
// there is nothing to grow ask NeedsGrow first.
func (d *LinuxHost) GrowFilesystem(ctx context.Context, dev, fsType, mountPath string) error {
	switch fsType {
	case "ext4":
		if mountPath == "" {
			return d.growExt4Offline(ctx, dev)
		}
		return d.growExt4Online(ctx, dev, mountPath)
	case "xfs":
		if mountPath == "" {
			return errdefs.Precondition("xfs grows only while mounted, and the filesystem on %s is not; mount it to grow it", dev)
		}
		path, err := d.writableMountOf(dev, fsType, mountPath)
		if err != nil {
			return err
		}
		if _, err := d.run.Run(ctx, "xfs_growfs", path); err != nil {
			return fmt.Errorf("grow the xfs filesystem on %s mounted at %s: %w", dev, path, err)
		}
		return nil
	case "btrfs":
		if mountPath == "" {
			return errdefs.Precondition("btrfs grows only while mounted, and the filesystem on %s is not; mount it to grow it", dev)
		}
		path, err := d.writableMountOf(dev, fsType, mountPath)
		if err != nil {
			return err
		}
		if _, err := d.run.Run(ctx, "btrfs", "filesystem", "resize", "max", path); err != nil {
			return fmt.Errorf("grow the btrfs filesystem on %s mounted at %s: %w", dev, path, err)
		}
		return nil
	}
	_, err := blockdev.FilesystemNamed(fsType)
	return err
}

// writableMountOf returns the path to grow the filesystem on dev through:
// mountPath, unless the mount table shows it read-only (a pod's read-only
// bind), in which case another, read-write mount of the same device (its
// staging path). xfs_growfs and btrfs resize fail with EROFS on a read-only
// mount even when the filesystem itself is writable. A filesystem mounted
// only read-only cannot grow now: a precondition failure.
func (d *LinuxHost) writableMountOf(dev, fsType, mountPath string) (string, error) {
	m, err := d.MountAt(mountPath)
	if err != nil {
		return "", err
	}
	if m == nil || !m.ReadOnly() {
		return mountPath, nil // not in the table: the tool says what is wrong
	}
	major, minor, isDev, err := d.blockDeviceAt(dev)
	if err != nil || !isDev {
		major, minor = 0, 0 // match the mounts by source alone
	}
	mounts, err := d.Mounts()
	if err != nil {
		return "", err
	}
	for i := range mounts {
		if !mounts[i].ReadOnly() && mounts[i].IsMountOf(dev, major, minor) {
			return mounts[i].MountPoint, nil
		}
	}
	return "", errdefs.Precondition("the %s filesystem on %s is mounted read-only (at %s) and nowhere read-write, so it cannot grow now; it grows when it is next staged read-write",
		fsType, dev, mountPath)
}

// e2fsck exit status bits (e2fsck(8)); 1 and 2 mean errors were corrected.
var e2fsckExitMeanings = []struct {
	bit     int
	meaning string
}{
	{4, "errors left uncorrected"},
	{8, "operational error"},
	{16, "usage or syntax error"},
	{32, "canceled by user request"},
	{128, "shared library error"},
}

func (d *LinuxHost) growExt4Offline(ctx context.Context, dev string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), offlineGrowTimeout)
	defer cancel()
	out, err := d.run.Run(ctx, "e2fsck", "-f", "-p", dev)
	if code := command.ExitCode(err); err != nil && (code < 0 || code > 3) {
		if code < 0 { // did not run, or was killed: says nothing about the filesystem
			return fmt.Errorf("check the ext4 filesystem on %s before growing it: %w", dev, err)
		}
		var meanings []string
		for _, m := range e2fsckExitMeanings {
			if code&m.bit != 0 {
				meanings = append(meanings, m.meaning)
			}
		}
		// e2fsck prints what it found on stdout, which the command error
		// does not carry.
		return errdefs.Wrap(errdefs.ErrPrecondition, err,
			"the ext4 filesystem on %s did not pass e2fsck -f -p (exit %d: %s), so it is not grown; repair it by hand (e2fsck without -p) and stage it again; e2fsck said: %q",
			dev, code, strings.Join(meanings, ", "), excerpt(out))
	}
	if _, err := d.run.Run(ctx, "resize2fs", dev); err != nil {
		return fmt.Errorf("grow the ext4 filesystem on %s: %w", dev, err)
	}
	return nil
}

// resize2fsPermissionDenied is what resize2fs 1.47 prints (exit 1) when the
// kernel answers its EXT4_IOC_RESIZE_FS ioctl with EPERM.
const resize2fsPermissionDenied = "Permission denied to resize filesystem"

// capSysResource is CAP_SYS_RESOURCE's bit in the /proc/<pid>/status masks.
const capSysResource = 24

func (d *LinuxHost) growExt4Online(ctx context.Context, dev, mountPath string) error {
	_, err := d.run.Run(ctx, "resize2fs", dev)
	if err == nil {
		return nil
	}
	if !strings.Contains(command.Stderr(err), resize2fsPermissionDenied) {
		return fmt.Errorf("grow the ext4 filesystem on %s mounted at %s: %w", dev, mountPath, err)
	}
	// The kernel refuses online ext4 growth with EPERM when the caller
	// lacks CAP_SYS_RESOURCE, and also when the filesystem has recorded
	// errors or was mounted from a backup superblock. Either way an offline
	// grow at the next stage (e2fsck first) is the way out.
	if has, capErr := d.programsHaveCapability(capSysResource); capErr == nil && !has {
		return errdefs.Wrap(errdefs.ErrPrecondition, err,
			"online ext4 growth needs CAP_SYS_RESOURCE, which this node plugin lacks, so the filesystem on %s mounted at %s stays at its old size; unstage and restage the volume to grow it offline (or give the node plugin CAP_SYS_RESOURCE)",
			dev, mountPath)
	}
	return errdefs.Wrap(errdefs.ErrPrecondition, err,
		"the kernel refused to grow the mounted ext4 filesystem on %s (at %s) online; it does so when the filesystem has recorded errors or was mounted from a backup superblock (see the kernel log), or the node plugin lacks CAP_SYS_RESOURCE; unstage and restage the volume to check and grow it offline",
		dev, mountPath)
}

// programsHaveCapability reports whether the programs this process runs
// get capability bit capBit. A program run as root gets the capabilities of
// the bounding set; as another user, only the ambient ones.
func programsHaveCapability(capBit uint) (bool, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, err
	}
	return capabilityInStatus(data, capBit, os.Geteuid() == 0)
}

// capabilityInStatus reads the CapBnd (root) or CapAmb mask of a
// /proc/<pid>/status text.
func capabilityInStatus(status []byte, capBit uint, root bool) (bool, error) {
	key := "CapAmb:"
	if root {
		key = "CapBnd:"
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return false, fmt.Errorf("parse %s %q: %w", key, v, err)
			}
			return mask&(1<<capBit) != 0, nil
		}
	}
	return false, fmt.Errorf("no %s line in the process status", key)
}
