package node

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	mountutils "k8s.io/mount-utils"
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

// VolumeHealthCheck says where a volume should be on this node.
type VolumeHealthCheck struct {
	// Device is the volume's device node, e.g. /dev/loop3.
	Device string
	// StagingPath is the volume's staging path. A block volume's stage
	// mounts nothing there, so it is not looked at for one.
	StagingPath string
	// PublishPath is one pod's target path, or "" to check the stage only.
	PublishPath string
	// Block is true for a block volume: its publish path is the device node
	// bind-mounted onto a file.
	Block bool
}

// CheckVolumeHealth reports what is abnormal about the volume v describes,
// as values: nil when it is healthy. It runs no command, changes nothing
// and never blocks on the device (it stats paths and reads the mount table
// and sysfs). The error is for a check that could not be made (an
// unreadable mount table, a stat failing in an unexpected way), never for a
// problem found. It does not prove that the device is the volume's image;
// that is the attacher's job.
func (d *DataPath) CheckVolumeHealth(v VolumeHealthCheck) ([]HealthProblem, error) {
	var r healthReport

	// The device. Its number identifies the mounts below; without it they
	// are matched by source path only.
	major, minor, isDev, err := d.blockDeviceAt(v.Device)
	switch {
	case errors.Is(err, os.ErrNotExist):
		r.add(ReasonDeviceMissing, "device %s does not exist", v.Device)
	case err != nil:
		return nil, fmt.Errorf("check device %s: %w", v.Device, err)
	case !isDev:
		r.add(ReasonDeviceMissing, "%s is not a block device", v.Device)
	default:
		size, err := d.deviceSize(v.Device)
		if err != nil {
			return nil, fmt.Errorf("check device %s: %w", v.Device, err)
		}
		if size == 0 {
			r.add(ReasonDeviceMissing, "device %s has no size: it is attached to nothing", v.Device)
		}
	}
	mountOfDevice := func(m *Mount) bool { return m.IsMountOf(v.Device, major, minor) }
	if !isDev {
		mountOfDevice = func(m *Mount) bool { return m.Source == v.Device }
	}

	if !v.Block {
		if err := d.checkMount(&r, v.StagingPath, "staging path", ReasonStagingMountMissing, ReasonStagingMountWrongDevice, v.Device, mountOfDevice); err != nil {
			return nil, err
		}
	}
	switch {
	case v.PublishPath == "":
	case v.Block:
		if err := d.checkDeviceBind(&r, v.PublishPath, v.Device, major, minor, isDev); err != nil {
			return nil, err
		}
	default:
		if err := d.checkMount(&r, v.PublishPath, "publish path", ReasonPublishMountMissing, ReasonPublishMountWrongDevice, v.Device, mountOfDevice); err != nil {
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

// checkMount checks that path is a live mount of the device whose
// filesystem is still as writable as it was mounted.
func (d *DataPath) checkMount(r *healthReport, path, what, missing, wrongDevice, dev string, mountOfDevice func(*Mount) bool) error {
	err := d.stat(path)
	switch {
	case mountutils.IsCorruptedMnt(err):
		r.add(ReasonMountCorrupted, "the mount at %s %s is dead: %v", what, path, err)
		return nil
	case errors.Is(err, os.ErrNotExist):
		r.add(missing, "%s %s does not exist", what, path)
		return nil
	case err != nil:
		return fmt.Errorf("check %s %s: %w", what, path, err)
	}
	m, err := d.MountAt(path)
	if err != nil {
		return err
	}
	switch {
	case m == nil:
		r.add(missing, "nothing is mounted at %s %s", what, path)
	case !mountOfDevice(m):
		r.add(wrongDevice, "%s %s holds %s %s, not the volume's device %s", what, path, m.FsType, m.Source, dev)
	case !m.ReadOnly() && kernelMadeReadOnly(m.SuperOptions) && !r.has(ReasonFilesystemReadOnly):
		// The staging mount and its binds share the filesystem: said once.
		r.add(ReasonFilesystemReadOnly, "the %s filesystem on %s, mounted read-write at %s %s, has been made read-only by the kernel (superblock options %s), usually after an I/O error or corruption; see the kernel log",
			m.FsType, dev, what, path, strings.Join(m.SuperOptions, ","))
	}
	return nil
}

// kernelMadeReadOnly reports whether a filesystem's superblock options say
// it went read-only. A mount asked read-only has "ro" in its per-mount
// options too, so the caller only asks for read-write mounts.
func kernelMadeReadOnly(superOptions []string) bool {
	return slices.Contains(superOptions, "ro") || slices.Contains(superOptions, "emergency_ro")
}

// checkDeviceBind checks that path (a block volume's publish path) is the
// device node, bind-mounted.
func (d *DataPath) checkDeviceBind(r *healthReport, path, dev string, major, minor uint32, devKnown bool) error {
	pMajor, pMinor, isDev, err := d.blockDeviceAt(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		r.add(ReasonPublishMountMissing, "publish path %s does not exist", path)
	case mountutils.IsCorruptedMnt(err):
		r.add(ReasonMountCorrupted, "the bind at publish path %s is dead: %v", path, err)
	case err != nil:
		return fmt.Errorf("check publish path %s: %w", path, err)
	case !isDev:
		r.add(ReasonPublishMountMissing, "publish path %s is not a device node: the volume's device %s is not bound there", path, dev)
	case devKnown && (pMajor != major || pMinor != minor):
		r.add(ReasonPublishMountWrongDevice, "publish path %s is device %d:%d, not the volume's device %s (%d:%d)", path, pMajor, pMinor, dev, major, minor)
	}
	return nil
}
