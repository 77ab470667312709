package driver

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/node"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

type controllerService struct {
	csi.UnimplementedControllerServer
	d *Driver
}

// controllerCapabilities is the controller half of the capability matrix:
// only what works end to end.
var controllerCapabilities = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
}

func (s *controllerService) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	caps := make([]*csi.ControllerServiceCapability, 0, len(controllerCapabilities))
	for _, c := range controllerCapabilities {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: c},
		}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *controllerService) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := validateName("name", req.GetName()); err != nil {
		return nil, err
	}
	caps, err := parseCapabilities("volume_capabilities", req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, errdefs.InvalidArgument("volume_content_source: creating a volume from a snapshot or another volume is not supported yet")
	}
	params, err := s.d.parseParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	inst := s.d.instances[params.instance]
	for i, c := range caps {
		if err := inst.Exporter.SupportsAccess(c.accessType, c.mode); err != nil {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capabilities[%d]", i)
		}
	}

	spec := backend.VolumeSpec{
		Name:          req.GetName(),
		RequiredBytes: req.GetCapacityRange().GetRequiredBytes(),
		LimitBytes:    req.GetCapacityRange().GetLimitBytes(),
		AccessType:    caps[0].accessType,
		Parameters:    params.shaping,
	}
	var minBytes int64
	if spec.AccessType == backend.AccessMount {
		spec.FsType = caps[0].fsType
		if spec.FsType == "" {
			spec.FsType = node.DefaultFsType
		}
		fs, err := node.LookupFilesystem(spec.FsType)
		if err != nil {
			return nil, err
		}
		minBytes = fs.MinBytes
	}
	if spec.CapacityBytes, err = resolveCapacity(req.GetCapacityRange(), minBytes); err != nil {
		return nil, err
	}

	release, err := s.d.locks.acquire("create/"+req.GetName(), "volume name "+req.GetName())
	if err != nil {
		return nil, err
	}
	defer release()

	img, err := inst.Store.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	id, err := volumeid.New(inst.Type, inst.Name, img.ID)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:      id.String(),
		CapacityBytes: img.CapacityBytes,
		VolumeContext: volumeContext(params),
	}}, nil
}

func (s *controllerService) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, errdefs.InvalidArgument("volume_id is required")
	}
	id, err := volumeid.Parse(req.GetVolumeId())
	if err != nil {
		// No Spindle volume can have this ID, so there is nothing to delete,
		// and the spec asks for success when the volume does not exist.
		s.d.log.Warn("DeleteVolume of an ID that is not a Spindle volume ID; nothing to delete",
			zap.String("volumeID", req.GetVolumeId()), zap.Error(err))
		return &csi.DeleteVolumeResponse{}, nil
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		// The ID is ours but its backend is not configured here: answering
		// "deleted" would make Kubernetes forget an image that still exists.
		return nil, err
	}
	release, err := s.d.locks.acquire("volume/"+id.String(), "volume "+id.String())
	if err != nil {
		return nil, err
	}
	defer release()
	if err := inst.Store.Delete(ctx, id.Image); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *controllerService) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	id, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if err := validateNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	c, err := parseCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}
	if err := inst.Exporter.SupportsAccess(c.accessType, c.mode); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capability")
	}
	release, err := s.d.locks.acquire("publish/"+id.String()+"/"+req.GetNodeId(), "volume "+id.String()+" on node "+req.GetNodeId())
	if err != nil {
		return nil, err
	}
	defer release()

	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	if err := checkCapabilityFits(img, c); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err, "volume_capability")
	}
	pc, err := inst.Exporter.Publish(ctx, id.Image, backend.Attachment{
		NodeID:     req.GetNodeId(),
		AccessMode: c.mode,
		ReadOnly:   req.GetReadonly() || c.mode.ReadOnly(),
		Since:      time.Now().UTC().Truncate(time.Second),
	})
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

// checkCapabilityFits refuses a capability the volume was not made for: a
// block volume's raw data must not be formatted over, and a filesystem
// volume keeps its fs type.
func checkCapabilityFits(img *backend.Image, c capability) error {
	if img.AccessType != c.accessType {
		return errdefs.InvalidArgument("volume %s was created for %s access, not %s", img.ID, img.AccessType, c.accessType)
	}
	if c.fsType != "" && img.FsType != "" && c.fsType != img.FsType {
		return errdefs.InvalidArgument("volume %s holds %s, not %s", img.ID, img.FsType, c.fsType)
	}
	return nil
}

func (s *controllerService) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	id, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if req.GetNodeId() != "" {
		if err := validateNodeID("node_id", req.GetNodeId()); err != nil {
			return nil, err
		}
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire("publish/"+id.String()+"/"+req.GetNodeId(), "volume "+id.String()+" on node "+req.GetNodeId())
	if err != nil {
		return nil, err
	}
	defer release()

	nodes := []string{req.GetNodeId()}
	if req.GetNodeId() == "" {
		// The spec: without a node, unpublish from every node.
		img, err := inst.Store.Get(ctx, id.Image)
		if errors.Is(err, errdefs.ErrNotFound) {
			return &csi.ControllerUnpublishVolumeResponse{}, nil
		}
		if err != nil {
			return nil, err
		}
		nodes = nodes[:0]
		for _, a := range img.Attachments {
			nodes = append(nodes, a.NodeID)
		}
	}
	for _, n := range nodes {
		if err := inst.Exporter.Unpublish(ctx, id.Image, n); err != nil {
			return nil, err
		}
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func (s *controllerService) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, errdefs.InvalidArgument("volume_capabilities is required")
	}
	inst, err := s.d.instanceFor(id)
	if err != nil {
		return nil, err
	}
	img, err := inst.Store.Get(ctx, id.Image)
	if err != nil {
		return nil, err
	}
	if _, err := s.d.parseParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	for i, vc := range req.GetVolumeCapabilities() {
		field := "volume_capabilities[" + strconv.Itoa(i) + "]"
		c, err := parseCapability(field, vc)
		if err == nil {
			if err = inst.Exporter.SupportsAccess(c.accessType, c.mode); err == nil {
				err = checkCapabilityFits(img, c)
			}
			if err != nil {
				err = errdefs.Wrap(errdefs.ErrInvalidArgument, err, "%s", field)
			}
		}
		if err != nil {
			// Unsupported is an answer, not an error: no confirmation, and why.
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}
