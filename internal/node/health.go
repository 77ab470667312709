package node

import (
	"fmt"
	"slices"
	"strings"
)

// The reasons a HealthProblem gives. They are stable CamelCase words, so
// that the volume-health RPCs and the people reading them can match on them.
const (
	// ReasonDeviceMissing: the volume's device node is gone, is no block
	// device, or is a device attached to nothing (a detached loop device
	// reads as size 0).
	ReasonDeviceMissing = "DeviceMissing"
	// ReasonStagingMountMissing: nothing is mounted at the staging path of
	// a filesystem volume, or the path itself is gone.
	ReasonStagingMountMissing = "StagingMountMissing"
	// ReasonStagingMountWrongDevice: the staging path holds a mount of
	// something other than the volume's device.
	ReasonStagingMountWrongDevice = "StagingMountWrongDevice"
	// ReasonPublishMountMissing: the publish path holds no bind of the
	// volume (no mount, for a filesystem; no device node, for a block volume).
	ReasonPublishMountMissing = "PublishMountMissing"
	// ReasonPublishMountWrongDevice: the publish path holds a mount, or a
	// device node, of something other than the volume's device.
	ReasonPublishMountWrongDevice = "PublishMountWrongDevice"
	// ReasonMountCorrupted: the path is a dead mount; stat fails with
	// ENOTCONN, ESTALE or EIO (an xfs that shut down after an I/O error
	// answers EIO).
	ReasonMountCorrupted = "MountCorrupted"
	// ReasonFilesystemReadOnly: the volume was mounted read-write but the
	// kernel has made its filesystem read-only, which ext4 does on an error
	// (errors=remount-ro; shown as "ro" or, since Linux 6.12, "emergency_ro").
	ReasonFilesystemReadOnly = "FilesystemReadOnly"
)

// HealthProblem is one abnormal condition of a volume on this node.
type HealthProblem struct {
	Reason  string // one of the Reason constants
	Message string // for people: what is wrong, naming the path or device
}

func (p HealthProblem) String() string { return p.Reason + ": " + p.Message }

// Degraded reports whether the volume still serves its data: a filesystem
// the kernel made read-only still serves reads; every other problem keeps
// the pod from its data.
func (p HealthProblem) Degraded() bool { return p.Reason == ReasonFilesystemReadOnly }

// checkHealth reports what is abnormal about the volume on dev, staged at
// staging (not looked at for a block volume, whose stage mounts nothing)
// and published at publish ("" to check the stage only), as values: nil
// when it is healthy. It runs no command, changes nothing and never blocks
// on the device: it stats the paths and the device, and reads the mount
// table for the superblock's options, where the kernel says that it made a
// filesystem read-only. It does not prove that
// the device is the volume's image; that is the attacher's job.
func (v *Volumes) checkHealth(dev, staging, publish string, block bool) ([]HealthProblem, error) {
	var r healthReport
	di, err := v.host.Stat(dev)
	if err != nil {
		return nil, fmt.Errorf("check device %s: %w", dev, err)
	}
	switch {
	case !di.Exists:
		r.add(ReasonDeviceMissing, "device %s does not exist", dev)
	case !di.IsBlockDevice():
		r.add(ReasonDeviceMissing, "%s is not a block device", dev)
	default:
		size, err := v.host.DeviceSize(dev)
		if err != nil {
			return nil, fmt.Errorf("check device %s: %w", dev, err)
		}
		if size == 0 {
			r.add(ReasonDeviceMissing, "device %s has no size: it is attached to nothing", dev)
		}
	}
	num := di.Rdev
	if !di.IsBlockDevice() {
		num = DevNum{}
	}
	if !block && staging != "" {
		if err := v.checkMount(&r, staging, "staging path", ReasonStagingMountMissing, ReasonStagingMountWrongDevice, dev, num); err != nil {
			return nil, err
		}
	}
	switch {
	case publish == "":
	case block:
		v.checkDeviceBind(&r, publish, dev, num)
	default:
		if err := v.checkMount(&r, publish, "publish path", ReasonPublishMountMissing, ReasonPublishMountWrongDevice, dev, num); err != nil {
			return nil, err
		}
	}
	return r.problems, nil
}

// healthReport collects the problems found.
type healthReport struct{ problems []HealthProblem }

func (r *healthReport) add(reason, format string, args ...any) {
	r.problems = append(r.problems, HealthProblem{Reason: reason, Message: fmt.Sprintf(format, args...)})
}

func (r *healthReport) has(reason string) bool {
	return slices.ContainsFunc(r.problems, func(p HealthProblem) bool { return p.Reason == reason })
}

// checkMount checks that path is a live mount of the filesystem on dev
// (num, when dev is a block device) that is still as writable as it was
// mounted.
func (v *Volumes) checkMount(r *healthReport, path, what, missing, wrongDevice, dev string, num DevNum) error {
	info, err := v.host.Stat(path)
	if err != nil {
		return fmt.Errorf("check %s %s: %w", what, path, err)
	}
	onDevice := info.Source == num && !num.IsZero()
	if num.IsZero() && !info.Source.IsZero() {
		onDevice = v.host.DevicePath(info.Source) == dev
	}
	switch {
	case info.Dead:
		r.add(ReasonMountCorrupted, "the mount at %s %s is dead: its filesystem no longer answers (ENOTCONN, ESTALE or EIO)", what, path)
	case !info.Exists:
		r.add(missing, "%s %s does not exist", what, path)
	case !info.MountRoot:
		r.add(missing, "nothing is mounted at %s %s", what, path)
	case !onDevice:
		r.add(wrongDevice, "%s %s holds %s, not the volume's device %s", what, path, describeFS(info.FsType, v.host.DevicePath(info.Source)), dev)
	case !r.has(ReasonFilesystemReadOnly):
		// statfs cannot tell: ext4 since Linux 6.12 goes "emergency_ro"
		// without marking the superblock read-only, and a read-only mount
		// asked for looks the same. The superblock's options in the mount
		// table say it, and the staging mount and its binds share them, so
		// it is said once.
		m, err := v.mountAt(path)
		if err != nil {
			return err
		}
		if m != nil && !m.ReadOnly() && kernelMadeReadOnly(m.SuperOptions) {
			r.add(ReasonFilesystemReadOnly, "the %s filesystem on %s, mounted read-write at %s %s, has been made read-only by the kernel (superblock options %s), usually after an I/O error or corruption; see the kernel log",
				m.FsType, dev, what, path, strings.Join(m.SuperOptions, ","))
		}
	}
	return nil
}

// mountAt reads the mount at path from the mount table.
func (v *Volumes) mountAt(path string) (*Mount, error) {
	mounts, err := v.host.Mounts()
	if err != nil {
		return nil, err
	}
	return topMountAt(mounts, Resolve(path)), nil
}

// kernelMadeReadOnly reports whether a filesystem's superblock options say
// it went read-only. A mount asked read-only has "ro" in its per-mount
// options too, so the caller only asks for read-write mounts.
func kernelMadeReadOnly(superOptions []string) bool {
	return slices.Contains(superOptions, "ro") || slices.Contains(superOptions, "emergency_ro")
}

// checkDeviceBind checks that path (a block volume's publish path) is the
// device node, bound there.
func (v *Volumes) checkDeviceBind(r *healthReport, path, dev string, num DevNum) {
	info, err := v.host.Stat(path)
	switch {
	case err != nil:
		r.add(ReasonPublishMountMissing, "publish path %s cannot be checked: %v", path, err)
	case info.Dead:
		r.add(ReasonMountCorrupted, "the bind at publish path %s is dead", path)
	case !info.Exists:
		r.add(ReasonPublishMountMissing, "publish path %s does not exist", path)
	case !info.IsBlockDevice():
		r.add(ReasonPublishMountMissing, "publish path %s is not a device node: the volume's device %s is not bound there", path, dev)
	case !num.IsZero() && info.Rdev != num:
		r.add(ReasonPublishMountWrongDevice, "publish path %s is device %s, not the volume's device %s (%s)", path, info.Rdev, dev, num)
	}
}
