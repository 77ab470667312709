package driver

import (
	"context"
	"maps"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/spindle-csi/spindle/internal/backend"
	"github.com/spindle-csi/spindle/internal/controller"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// The controller service translates CSI to the controller side
// (internal/controller's Controller): it validates each request, parses
// the IDs it names (one Spindle never issued names nothing), calls, and
// lets the one error mapping turn the result into a code. What a volume
// is and what is done to it is the controller side's.

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
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
	csi.ControllerServiceCapability_RPC_GET_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
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
	source, err := contentSource(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	vol, err := s.d.ctrl.CreateVolume(ctx, controller.CreateRequest{
		Name: req.GetName(), Capabilities: caps, Parameters: req.GetParameters(), MutableParameters: req.GetMutableParameters(),
		RequiredBytes: req.GetCapacityRange().GetRequiredBytes(), LimitBytes: req.GetCapacityRange().GetLimitBytes(),
		Accessibility: accessibility(req.GetAccessibilityRequirements()), Source: source,
	})
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: csiVolume(vol)}, nil
}

// contentSource reads a volume_content_source: the snapshot or the volume
// it names, looked up by the controller side.
func contentSource(cs *csi.VolumeContentSource) (*controller.Source, error) {
	if cs == nil {
		return nil, nil
	}
	var src controller.Source
	switch t := cs.GetType().(type) {
	case *csi.VolumeContentSource_Snapshot:
		src = controller.Source{Snapshot: true, Field: "volume_content_source.snapshot.snapshot_id", ID: t.Snapshot.GetSnapshotId()}
	case *csi.VolumeContentSource_Volume:
		src = controller.Source{Field: "volume_content_source.volume.volume_id", ID: t.Volume.GetVolumeId()}
	default:
		return nil, errdefs.InvalidArgument("volume_content_source must name a snapshot or a volume")
	}
	if src.ID == "" {
		return nil, errdefs.InvalidArgument("%s is required", src.Field)
	}
	return &src, nil
}

// csiVolume is a volume as CreateVolume, ListVolumes and ControllerGetVolume
// return it.
func csiVolume(v *controller.Volume) *csi.Volume {
	out := &csi.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes, VolumeContext: v.Context, AccessibleTopology: csiTopologies(v.Topology)}
	switch {
	case v.SourceSnapshotID != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshotID},
		}}
	case v.SourceVolumeID != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.SourceVolumeID},
		}}
	}
	return out
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
	if err := s.d.ctrl.DeleteVolume(ctx, id); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *controllerService) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := validateNodeID("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	c, err := parseCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	var pc map[string]string
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	switch {
	case errdefs.KindOf(err) == errdefs.ErrNotFound && backend.IsStatic(req.GetVolumeContext()):
		// A pre-provisioned volume (static.go): its handle is no Spindle ID.
		pc, err = s.d.ctrl.PublishStatic("volume_id", req.GetVolumeId(), req.GetVolumeContext(), c.Capability, req.GetReadonly())
	case err == nil:
		pc, err = s.d.ctrl.Publish(ctx, controller.PublishRequest{ID: id, NodeID: req.GetNodeId(), Capability: c.Capability, ReadOnly: req.GetReadonly()})
	}
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

func (s *controllerService) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetNodeId() != "" {
		if err := validateNodeID("node_id", req.GetNodeId()); err != nil {
			return nil, err
		}
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if errdefs.KindOf(err) == errdefs.ErrNotFound {
		// No Spindle volume has this ID, so no node holds it: it is
		// unpublished everywhere, and the spec asks for success.
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := s.d.ctrl.Unpublish(ctx, id, req.GetNodeId()); err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func (s *controllerService) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if err := requireVolumeID("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, errdefs.InvalidArgument("volume_capabilities is required")
	}
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	// The capabilities up to the first malformed one go to the controller
	// side, which checks them in order: whichever refusal comes first is
	// the answer.
	var caps []controller.Capability
	var malformed error
	for i, vc := range req.GetVolumeCapabilities() {
		c, err := parseCapability("volume_capabilities["+strconv.Itoa(i)+"]", vc)
		if err != nil {
			malformed = err
			break
		}
		caps = append(caps, c.Capability)
	}
	unsupported, err := s.d.ctrl.ValidateCapabilities(ctx, id, req.GetParameters(), caps)
	if err != nil {
		return nil, err
	}
	if unsupported == nil {
		unsupported = malformed
	}
	if unsupported != nil {
		// Unsupported is an answer, not an error: no confirmation, and why.
		return &csi.ValidateVolumeCapabilitiesResponse{Message: unsupported.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ControllerModifyVolume changes a volume's mutable parameters (its
// VolumeAttributesClass).
func (s *controllerService) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if err := s.d.ctrl.Modify(ctx, id, req.GetMutableParameters()); err != nil {
		return nil, err
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}

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
	size, err := s.d.ctrl.Expand(ctx, id, req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes())
	if err != nil {
		return nil, err
	}
	// Both kinds need the node: a filesystem to grow, and for a block
	// volume a loop device that still has the old size until refreshed.
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
}

func (s *controllerService) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	all, err := s.d.ctrl.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	page, next, err := pageOf(s.d, all, func(v *controller.Volume) string { return v.ID }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range page {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: csiVolume(v),
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: v.PublishedNodes},
		})
	}
	return resp, nil
}

func (s *controllerService) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	id, err := lookupVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	v, err := s.d.ctrl.GetVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: csiVolume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: v.PublishedNodes},
	}, nil
}

// GetCapacity reports what the instance the parameters select can still
// allocate; capacity a request could not use is reported as zero.
func (s *controllerService) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	caps := make([]controller.Capability, 0, len(req.GetVolumeCapabilities()))
	for i, vc := range req.GetVolumeCapabilities() {
		c, err := parseCapability("volume_capabilities["+strconv.Itoa(i)+"]", vc)
		if err != nil {
			return nil, err
		}
		caps = append(caps, c.Capability)
	}
	var topology controller.Topology
	if t := req.GetAccessibleTopology(); t != nil {
		topology = controller.Topology(maps.Clone(t.GetSegments()))
		if topology == nil {
			topology = controller.Topology{} // a topology that names nothing is no node's
		}
	}
	c, err := s.d.ctrl.Capacity(ctx, req.GetParameters(), caps, topology)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return &csi.GetCapacityResponse{}, nil
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: c.AvailableBytes,
		MaximumVolumeSize: wrapperspb.Int64(c.MaximumVolumeBytes),
		MinimumVolumeSize: wrapperspb.Int64(c.MinimumVolumeBytes),
	}, nil
}
