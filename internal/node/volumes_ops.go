package node

import (
	"context"
	"fmt"
	"slices"

	"github.com/spindle-csi/spindle/internal/backend"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Expand makes the node see the volume's grown image at path (its staging
// path, or a pod's publish): the device refreshed to the image's size and
// the filesystem on it grown. staging, when known, is a read-write mount
// to grow through when path is a read-only bind. It returns the device's
// size, which must reach requiredBytes.
func (v *Volumes) Expand(ctx context.Context, vol Volume, path, staging string, requiredBytes int64) (int64, error) {
	p, err := v.volumeAt(ctx, vol, path)
	if err != nil {
		return 0, err
	}
	size, err := vol.Attacher.Refresh(ctx, vol.Image, p.Device)
	if err != nil {
		return 0, err
	}
	if requiredBytes > size {
		return 0, errdefs.OutOfRange("volume %s is %d bytes on this node, less than the %d bytes asked for; expand it with ControllerExpandVolume first", vol.ID, size, requiredBytes)
	}
	if p.Crypt != nil && !p.Crypt.ReadOnly {
		// The mapping first, then the filesystem on it.
		if err := v.host.LUKSResize(ctx, p.Crypt.Name); err != nil {
			return 0, err
		}
	}
	if !p.Filesystem() {
		return size, nil
	}
	growAt := path
	if p.Info.ReadOnly && staging != "" && staging != path {
		if sp, err := v.Locate(ctx, vol, staging); err == nil && sp.Mine && sp.Filesystem() && !sp.Info.ReadOnly {
			growAt = staging
		}
	}
	if err := v.host.GrowFilesystem(ctx, p.TopDevice(), p.Info.FsType, growAt); err != nil {
		return 0, err
	}
	return size, nil
}

// volumeAt finds the volume's device at path: under the filesystem mounted
// there (its staging path or a pod's bind of it), or bound there (a block
// publish). Anything else is NOT_FOUND, as the CSI spec has it for a path
// that is not the volume's.
func (v *Volumes) volumeAt(ctx context.Context, vol Volume, path string) (*Place, error) {
	p, err := v.Locate(ctx, vol, path)
	if err != nil {
		return nil, err
	}
	switch {
	case !p.Info.Exists:
		return nil, errdefs.NotFound("volume_path %s does not exist", path)
	case !p.Info.MountRoot && !p.Info.Dead:
		return nil, errdefs.NotFound("volume_path %s is not a mount of volume %s", path, vol.ID)
	case !p.Mine || p.Device == "" || !(p.Filesystem() || p.DeviceBind()):
		return nil, errdefs.NotFound("volume_path %s is not a mount of volume %s (it holds %s)", path, vol.ID, p.Holds())
	}
	return p, nil
}

// VolumeStats is what NodeGetVolumeStats reports.
type VolumeStats struct {
	// Block: the path is the volume's device, and only SizeBytes is known.
	Block     bool
	SizeBytes int64
	FilesystemUsage
}

// Stats reports the usage of the volume at path; a path that is not the
// volume's mount fails instead of describing another filesystem.
func (v *Volumes) Stats(ctx context.Context, vol Volume, path string) (VolumeStats, error) {
	p, err := v.volumeAt(ctx, vol, path)
	if err != nil {
		return VolumeStats{}, err
	}
	if p.DeviceBind() {
		size, err := v.host.DeviceSize(p.TopDevice())
		if err != nil {
			return VolumeStats{}, err
		}
		return VolumeStats{Block: true, SizeBytes: size}, nil
	}
	u, err := v.host.Usage(path)
	if err != nil {
		return VolumeStats{}, err
	}
	return VolumeStats{SizeBytes: u.TotalBytes, FilesystemUsage: u}, nil
}

// Health checks the volume where kubelet says it is (its staging path, a
// pod's publish path, or neither): a device attached for it, the mounts in
// place, alive and as writable as they were mounted. It reports problems,
// not errors; the error is for a check that could not be made.
func (v *Volumes) Health(ctx context.Context, vol Volume, staging, publish string) ([]HealthProblem, error) {
	dev, block, err := v.stagedDevice(ctx, vol, staging)
	if err != nil {
		return nil, err
	}
	if publish != "" {
		if info, err := v.host.Stat(publish); err == nil && info.IsBlockDevice() {
			block = true // a block publish is the device node bound onto a file
		}
	}
	if dev == "" {
		return []HealthProblem{{Reason: ReasonDeviceMissing, Message: fmt.Sprintf("volume %s has no device attached on node %s", vol.ID, v.opts.NodeID)}}, nil
	}
	return v.checkHealth(dev, staging, publish, block)
}

// stagedDevice names the device the volume was staged with on this node:
// the one its stage record names, else the one under its filesystem at
// staging, else any device attached for it; "" when there is none. block
// says whether it was staged as a block volume.
func (v *Volumes) stagedDevice(ctx context.Context, vol Volume, staging string) (dev string, block bool, err error) {
	if staging != "" {
		p, err := v.Locate(ctx, vol, staging)
		if err != nil {
			return "", false, err
		}
		switch {
		case p.Record != nil && p.Record.VolumeID == vol.ID:
			return p.Record.TopDevice(), p.Record.AccessType == "block", nil
		case p.Mine && p.Filesystem():
			return p.TopDevice(), false, nil
		}
	}
	devs, err := vol.Attacher.Devices(ctx, vol.Image)
	if err != nil {
		return "", false, err
	}
	// An encrypted volume is used through its mapping, if it is open.
	if m, err := v.host.CryptMappingByName(CryptName(vol.ID)); err != nil {
		return "", false, err
	} else if m.Found() && slices.ContainsFunc(devs, func(d backend.Device) bool { return d.Path == m.Backing }) {
		return m.Path, false, nil
	}
	for _, d := range devs {
		if !d.ReadOnly {
			return d.Path, false, nil
		}
	}
	if len(devs) > 0 {
		return devs[0].Path, false, nil
	}
	return "", false, nil
}
