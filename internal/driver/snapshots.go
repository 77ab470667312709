package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/spindle-csi/spindle/internal/controller"
	"github.com/spindle-csi/spindle/internal/errdefs"
	"github.com/spindle-csi/spindle/internal/volumeid"
)

// Snapshots (the controller service) and group snapshots (the CSI
// GroupController), translated to the controller side. Snapshot and group
// snapshot IDs have the volume ID format, "<backend>/<instance>/<name>".

// csiSnapshot describes a snapshot. It leaves out the optional (alpha)
// accessible_topology: a snapshot is where its source volume is, which the
// volume already says, and csi-sanity v5.6.0 compares a reported topology
// with reflect-based equality that a protobuf message never passes after a
// round trip (its size cache differs), failing every driver that fills it.
func csiSnapshot(s controller.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     s.ID,
		SourceVolumeId: s.SourceVolumeID,
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     s.ReadyToUse,
	}
}

func (s *controllerService) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := validateName("name", req.GetName()); err != nil {
		return nil, err
	}
	source, err := lookupVolumeID("source_volume_id", req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	snap, err := s.d.ctrl.CreateSnapshot(ctx, req.GetName(), source, req.GetParameters(), accessibility(req.GetAccessibilityRequirements()))
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(*snap)}, nil
}

func (s *controllerService) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, errdefs.InvalidArgument("snapshot_id is required")
	}
	id, err := volumeid.Parse(req.GetSnapshotId())
	if err != nil {
		// No Spindle snapshot has this ID: nothing to delete (see DeleteVolume).
		s.d.log.Warn("DeleteSnapshot of an ID that is not a Spindle snapshot ID; nothing to delete",
			zap.String("snapshotID", req.GetSnapshotId()), zap.Error(err))
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if err := s.d.ctrl.DeleteSnapshot(ctx, id); err != nil {
		return nil, err
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

func (s *controllerService) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, errdefs.InvalidArgument("snapshot_id is required")
	}
	id, err := volumeid.Parse(req.GetSnapshotId())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, err, "snapshot_id %q names no Spindle snapshot", req.GetSnapshotId())
	}
	snap, err := s.d.ctrl.GetSnapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	return &csi.GetSnapshotResponse{Snapshot: csiSnapshot(*snap)}, nil
}

// ListSnapshots lists every snapshot, or those of one source volume, or the
// one snapshot asked for; an ID that names nothing gives an empty list, as
// the spec asks, not an error.
func (s *controllerService) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	all, err := s.d.ctrl.ListSnapshots(ctx, req.GetSnapshotId(), req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	page, next, err := pageOf(s.d, all, func(s controller.Snapshot) string { return s.ID }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, snap := range page {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(snap)})
	}
	return resp, nil
}

type groupControllerService struct {
	csi.UnimplementedGroupControllerServer
	d *Driver
}

func (s *groupControllerService) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	resp := &csi.GroupControllerGetCapabilitiesResponse{}
	if s.d.ctrl.GroupSnapshots() {
		resp.Capabilities = append(resp.Capabilities, &csi.GroupControllerServiceCapability{
			Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
				Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT,
			}},
		})
	}
	return resp, nil
}

func csiGroupSnapshot(g *controller.GroupSnapshot) *csi.VolumeGroupSnapshot {
	out := &csi.VolumeGroupSnapshot{GroupSnapshotId: g.ID, CreationTime: timestamppb.New(g.CreatedAt), ReadyToUse: g.ReadyToUse}
	for _, snap := range g.Snapshots {
		c := csiSnapshot(snap)
		c.GroupSnapshotId = g.ID
		out.Snapshots = append(out.Snapshots, c)
	}
	return out
}

func (s *groupControllerService) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	if err := validateName("name", req.GetName()); err != nil {
		return nil, err
	}
	if len(req.GetSourceVolumeIds()) == 0 {
		return nil, errdefs.InvalidArgument("source_volume_ids is required")
	}
	sources := make([]volumeid.ID, 0, len(req.GetSourceVolumeIds()))
	for _, raw := range req.GetSourceVolumeIds() {
		id, err := lookupVolumeID("source_volume_ids", raw)
		if err != nil {
			return nil, err
		}
		sources = append(sources, id)
	}
	g, err := s.d.ctrl.CreateGroupSnapshot(ctx, req.GetName(), sources, req.GetParameters())
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: csiGroupSnapshot(g)}, nil
}

// groupSnapshotID parses a group snapshot ID.
func groupSnapshotID(raw string) (volumeid.ID, error) {
	if raw == "" {
		return volumeid.ID{}, errdefs.InvalidArgument("group_snapshot_id is required")
	}
	id, err := volumeid.Parse(raw)
	if err != nil {
		return volumeid.ID{}, errdefs.Wrap(errdefs.ErrNotFound, err, "group_snapshot_id %.64q names no Spindle group snapshot", raw)
	}
	return id, nil
}

func (s *groupControllerService) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	id, err := groupSnapshotID(req.GetGroupSnapshotId())
	if err != nil {
		return nil, err
	}
	g, err := s.d.ctrl.GetGroupSnapshot(ctx, id, req.GetSnapshotIds())
	if err != nil {
		return nil, err
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: csiGroupSnapshot(g)}, nil
}

func (s *groupControllerService) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	if req.GetGroupSnapshotId() == "" {
		return nil, errdefs.InvalidArgument("group_snapshot_id is required")
	}
	id, err := volumeid.Parse(req.GetGroupSnapshotId())
	if err != nil {
		// No Spindle group snapshot has this ID: nothing to delete.
		s.d.log.Warn("DeleteVolumeGroupSnapshot of an ID that is not a Spindle group snapshot ID; nothing to delete",
			zap.String("groupSnapshotID", req.GetGroupSnapshotId()), zap.Error(err))
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
	}
	if err := s.d.ctrl.DeleteGroupSnapshot(ctx, id, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}
