package driver

import (
	"context"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// ControllerExpandVolume grows the image; the node then refreshes its
// device and grows the filesystem (NodeExpandVolume, or the next stage).
func (s *controllerService) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil {
		return nil, errdefs.InvalidArgument("capacity_range is required")
	}
	if req.GetVolumeCapability() != nil {
		if _, err := parseCapability("volume_capability", req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, release, err := s.d.lockVolume("volume", id)
	if err != nil {
		return nil, err
	}
	defer release()

	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	size, err := resolveCapacity(req.GetCapacityRange(), 0)
	if err != nil {
		return nil, err
	}
	if size < img.CapacityBytes {
		return nil, errdefs.OutOfRange("volume %s is %d bytes; shrinking it to %d bytes is not supported", id, img.CapacityBytes, size)
	}
	if img, err = inst.Store.Expand(ctx, id.Image, size); err != nil {
		return nil, err
	}
	// Both kinds need the node: a filesystem to grow, and for a block
	// volume a loop device that still has the old size until refreshed.
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: img.CapacityBytes, NodeExpansionRequired: true}, nil
}

// NodeExpandVolume makes the node see an expanded image: the device is
// refreshed to the image's size and the filesystem on it grown.
func (s *nodeService) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	path, err := s.confineVolumePath(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	if sp := req.GetStagingTargetPath(); sp != "" {
		if _, err := s.confinePath("staging_target_path", sp); err != nil {
			return nil, err
		}
	}
	if req.GetVolumeCapability() != nil {
		if _, err := parseCapability("volume_capability", req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	if r := req.GetCapacityRange(); r != nil {
		if _, err := resolveCapacity(r, 0); err != nil {
			return nil, err
		}
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	inst, release, err := s.d.lockVolume("node", id)
	if err != nil {
		return nil, err
	}
	defer release()

	dev, mountPoint, err := s.volumeAt(ctx, inst, id, path)
	if err != nil {
		return nil, err
	}
	size, err := inst.Attacher.Refresh(ctx, id.Image, dev.Path)
	if err != nil {
		return nil, err
	}
	if required := req.GetCapacityRange().GetRequiredBytes(); required > size {
		return nil, errdefs.OutOfRange("volume %s is %d bytes on this node, less than the %d bytes asked for; expand it with ControllerExpandVolume first", id, size, required)
	}
	if mountPoint != nil {
		if err := s.d.data.GrowFilesystem(ctx, dev.Path, mountPoint.FsType, path); err != nil {
			return nil, err
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// volumeAt finds the volume's device at path: a device node bound there (a
// block publish), or the device under the filesystem mounted there (its
// staging path or a pod's bind of it); for a filesystem it also returns the
// mount. A path that is neither is NOT_FOUND.
func (s *nodeService) volumeAt(ctx context.Context, inst *backend.Instance, id volumeid.ID, path string) (*node.VolumeDevice, *node.Mount, error) {
	major, minor, isDev, err := node.BlockDeviceAt(path)
	if os.IsNotExist(err) {
		return nil, nil, errdefs.NotFound("volume_path %s does not exist", path)
	}
	if err != nil {
		return nil, nil, err
	}
	if isDev {
		d, err := s.identify(ctx, inst, id, node.DevicePath(major, minor))
		if err != nil {
			return nil, nil, err
		}
		if d == nil {
			return nil, nil, errdefs.NotFound("volume_path %s is a device, but not one of volume %s", path, id)
		}
		return d, nil, nil
	}
	m, err := s.d.data.MountAt(path)
	if err != nil {
		return nil, nil, err
	}
	if m == nil {
		return nil, nil, errdefs.NotFound("volume_path %s is not a mount of volume %s", path, id)
	}
	d, err := s.mountedDevice(ctx, inst, id, m)
	if err != nil {
		return nil, nil, err
	}
	if d == nil {
		return nil, nil, errdefs.NotFound("volume_path %s is not a mount of volume %s (it holds %s %s)", path, id, m.FsType, m.Source)
	}
	return d, m, nil
}
