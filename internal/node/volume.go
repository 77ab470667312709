package node

import (
	"fmt"
	"path/filepath"
)

// VolumeDevice is a device attached for a volume on this node, with its
// device number: how the volume's mounts are recognised in the mount table.
type VolumeDevice struct {
	Path         string
	ReadOnly     bool
	Major, Minor uint32
}

// NewVolumeDevice reads the device number of the device node at path.
func NewVolumeDevice(path string, readOnly bool) (*VolumeDevice, error) {
	major, minor, err := DeviceNumber(path)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", path, err)
	}
	return &VolumeDevice{Path: path, ReadOnly: readOnly, Major: major, Minor: minor}, nil
}

// IsFilesystemOf reports whether m is a filesystem mounted from d.
func (d *VolumeDevice) IsFilesystemOf(m *Mount) bool { return m.IsMountOf(d.Path, d.Major, d.Minor) }

// VolumeDevices are the devices attached for one volume on this node.
type VolumeDevices []VolumeDevice

// FilesystemMount returns the device whose filesystem m is, or nil.
func (vd VolumeDevices) FilesystemMount(m *Mount) *VolumeDevice {
	for i := range vd {
		if vd[i].IsFilesystemOf(m) {
			return &vd[i]
		}
	}
	return nil
}

// DeviceBind returns the device whose device node is bind-mounted at m (a
// block publish), or nil. The mount's root names the device node ("/loop3"
// under devtmpfs, or a container's /dev); the mount point's device number
// confirms it.
func (vd VolumeDevices) DeviceBind(m *Mount) *VolumeDevice {
	for i := range vd {
		if m.Root != "/"+filepath.Base(vd[i].Path) {
			continue
		}
		major, minor, isDev, err := BlockDeviceAt(m.MountPoint)
		if err == nil && isDev && major == vd[i].Major && minor == vd[i].Minor {
			return &vd[i]
		}
	}
	return nil
}

// ByPath returns the device at path, or nil.
func (vd VolumeDevices) ByPath(path string) *VolumeDevice {
	for i := range vd {
		if vd[i].Path == path {
			return &vd[i]
		}
	}
	return nil
}

// ByNumber returns the device with that number, or nil.
func (vd VolumeDevices) ByNumber(major, minor uint32) *VolumeDevice {
	for i := range vd {
		if vd[i].Major == major && vd[i].Minor == minor {
			return &vd[i]
		}
	}
	return nil
}

// TopMount finds the top-most mount at path (as the mount table shows it:
// symlinks resolved) in an already-read table, or nil.
func TopMount(mounts []Mount, path string) *Mount {
	return topMountAt(mounts, Resolve(path))
}

// MountedElsewhere returns a mount point, other than staging, of a
// filesystem on one of vd: where the volume is staged (or published)
// already.
func (vd VolumeDevices) MountedElsewhere(mounts []Mount, staging string) string {
	for i := range mounts {
		if m := &mounts[i]; m.MountPoint != staging && vd.FilesystemMount(m) != nil {
			return m.MountPoint
		}
	}
	return ""
}

// PublishedAt returns a mount point where the volume staged at staging is
// still published, or "": another mount of the staging mount's filesystem
// (found without the volume's devices), or, with nothing mounted at
// staging, a filesystem on or a bind of one of vd.
func (vd VolumeDevices) PublishedAt(mounts []Mount, staging string) string {
	if st := TopMount(mounts, staging); st != nil {
		resolved := Resolve(staging)
		for i := range mounts {
			m := &mounts[i]
			// The staging mount itself (or a stack of them): Unmount takes them all.
			if m.MountPoint != resolved && m.Major == st.Major && m.Minor == st.Minor {
				return m.MountPoint
			}
		}
		return ""
	}
	for i := range mounts {
		if m := &mounts[i]; vd.FilesystemMount(m) != nil || vd.DeviceBind(m) != nil {
			return m.MountPoint
		}
	}
	return ""
}
