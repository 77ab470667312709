package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
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
	if _, err := backend.CheckExpand(id.String(), img.CapacityBytes, size); err != nil {
		return nil, err
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
	staging := req.GetStagingTargetPath()
	if staging != "" {
		if staging, err = s.confinePath("staging_target_path", staging); err != nil {
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
	t, release, err := s.d.lockNodeVolume(req.GetVolumeId(), nil)
	if err != nil {
		return nil, err
	}
	defer release()
	size, err := s.d.node.Expand(ctx, t.vol, path, staging, req.GetCapacityRange().GetRequiredBytes())
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
